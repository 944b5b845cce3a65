package follow

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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

// holdClaimEnv makes this test binary claim tag "t" on UDP port 53 of the
// santad at the socket it names, say "held" (or why not) and hold the claim
// until its standard input closes: a controller run by another user.
const holdClaimEnv = "SANTA_TEST_HOLD_CLAIM"

func holdClaim(socket string) int {
	c, err := ClaimTag(socket, api.ProtocolUDP, 53, "t")
	if err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println("held")
	io.Copy(io.Discard, os.Stdin)
	c.Release()
	return 0
}

// TestClaimTagOtherUser: santad's socket is open to every user, who may run
// a controller for a server of theirs. A user's controller claims its tag
// in the directory root's controller made, and holds no claim that blocks
// root's controller with the same tag on the same port. (The directory was
// root's only: a user's controller could not start.)
func TestClaimTagOtherUser(t *testing.T) {
	dir, err := os.MkdirTemp("", "santa-claims-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// the user must reach the directory and run a copy of this binary
	exe, err := os.Executable()
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	var b []byte
	if err == nil {
		b, err = os.ReadFile(exe)
	}
	helper := filepath.Join(dir, "claim.test")
	if err == nil {
		err = os.WriteFile(helper, b, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "santa.sock")
	first, err := ClaimTag(socket, api.ProtocolUDP, 53, "t") // root's controller, before
	if err != nil {
		t.Fatal(err)
	}
	first.Release()
	cmd := exec.Command(helper)
	cmd.Env = append(os.Environ(), holdClaimEnv+"="+socket)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "held\n" {
		t.Fatalf("a claim by uid 65534: %q, want held", line)
	}
	c, err := ClaimTag(socket, api.ProtocolUDP, 53, "t")
	if err != nil {
		t.Fatalf("root's claim of the tag uid 65534 holds: %v", err)
	}
	c.Release()
}
