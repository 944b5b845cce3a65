package follow

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/santa-offload/santa/api"
)

// TestClaimTag: a tag is claimed once per protocol and port of one santad;
// a second claim fails naming the tag and the holder's pid, until the
// holder releases it. Other tags, ports and protocols are claims of their
// own.
func TestClaimTag(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "santa.sock")
	claim := func(protocol uint32, port uint16, tag string) (*Claim, error) {
		return ClaimTag(socket, protocol, port, tag)
	}
	held, err := claim(api.ProtocolTCP, 80, "a/b")
	if err != nil {
		t.Fatal(err)
	}
	_, err = claim(api.ProtocolTCP, 80, "a/b")
	want := fmt.Sprintf(`another controller (pid %d) runs with tag "a/b" on TCP port 80`, os.Getpid())
	if !errors.Is(err, ErrTagClaimed) || !strings.Contains(err.Error(), want) {
		t.Fatalf("a second claim: %v, want ErrTagClaimed saying %q", err, want)
	}
	for _, other := range []struct {
		protocol uint32
		port     uint16
		tag      string
	}{{api.ProtocolTCP, 80, "a"}, {api.ProtocolTCP, 8080, "a/b"}, {api.ProtocolUDP, 80, "a/b"}} {
		c, err := claim(other.protocol, other.port, other.tag)
		if err != nil {
			t.Fatalf("claim %+v beside the held one: %v", other, err)
		}
		c.Release()
	}
	held.Release()
	again, err := claim(api.ProtocolTCP, 80, "a/b")
	if err != nil {
		t.Fatalf("a claim after the holder released it: %v", err)
	}
	again.Release()
}
