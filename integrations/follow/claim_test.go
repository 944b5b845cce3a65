package follow

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/internal/testbed"
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

// TestClaimTagWithoutSantadDir: a claim for a socket whose directory does
// not exist (santad never ran there, or a mistyped --socket-path) fails
// saying so, as a connection would, and makes no directory.
func TestClaimTagWithoutSantadDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "typo")
	_, err := ClaimTag(filepath.Join(dir, "santa.sock"), api.ProtocolTCP, 80, "t")
	if !errors.Is(err, syscall.ENOENT) || !strings.Contains(err.Error(), "is santad running?") {
		t.Errorf("claim: %v, want ENOENT asking whether santad runs", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the claim made %s (%v)", dir, err)
	}
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
	dir := claimsTestDir(t)
	socket := filepath.Join(dir, "santa.sock")
	first, err := ClaimTag(socket, api.ProtocolUDP, 53, "t") // root's controller, before
	if err != nil {
		t.Fatal(err)
	}
	first.Release()
	if line := holdClaimAsNobody(t, dir, socket); line != "held\n" {
		t.Fatalf("a claim by uid 65534: %q, want held", line)
	}
	c, err := ClaimTag(socket, api.ProtocolUDP, 53, "t")
	if err != nil {
		t.Fatalf("root's claim of the tag uid 65534 holds: %v", err)
	}
	c.Release()
}

// claimsTestDir is a directory for a santad socket that uid 65534 can
// reach, with a copy of this test binary it can run (holdClaimAsNobody).
func claimsTestDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "santa-claims-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	exe, err := os.Executable()
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	var b []byte
	if err == nil {
		b, err = os.ReadFile(exe)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "claim.test"), b, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// holdClaimAsNobody has uid 65534 claim tag "t" on UDP port 53 (holdClaim)
// and returns what it says; it holds a claim it got until the test ends.
func holdClaimAsNobody(t *testing.T, dir, socket string) string {
	cmd := exec.Command(filepath.Join(dir, "claim.test"))
	cmd.Env = append(os.Environ(), holdClaimEnv+"="+socket)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	_, out := testbed.StartPiped(t, cmd)
	out.Scan()
	return out.Text() + "\n"
}

// TestClaimTagPlanted: the claims directory is writable by every user
// (sticky, as /tmp), so another user may put something at the path of
// root's claim before root's controller starts: a symlink to a file of
// root's, which the controller must not follow (it would truncate the file
// and write its pid there), or a file of its own that it holds locked,
// which must not keep root's controller from starting. Once root holds its
// claim, no other user can open it to lock it. A user's controller is
// refused a claim file another user put at its path, naming the owner.
func TestClaimTagPlanted(t *testing.T) {
	dir := claimsTestDir(t)
	socket := filepath.Join(dir, "santa.sock")
	if err := api.MakeClaimsDir(socket); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(api.ClaimsDir(socket), "udp-53-uid0-t")
	asNobody := func(argv ...string) *exec.Cmd {
		return exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "--"}, argv...)...)
	}
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("root's data\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := asNobody("ln", "-s", victim, path).CombinedOutput(); err != nil {
		t.Fatalf("nobody's symlink: %v %s", err, out)
	}
	if c, err := ClaimTag(socket, api.ProtocolUDP, 53, "t"); err != nil {
		t.Errorf("root's claim beside nobody's symlink: %v", err)
	} else {
		c.Release()
	}
	if b, _ := os.ReadFile(victim); string(b) != "root's data\n" {
		t.Errorf("the file nobody's symlink names holds %q after root's claim, want it untouched", b)
	}

	os.Remove(path)
	// a directory with a file in it, which os.Remove cannot remove
	if out, err := asNobody("sh", "-c", "mkdir "+path+" && touch "+path+"/x").CombinedOutput(); err != nil {
		t.Fatalf("nobody's directory: %v %s", err, out)
	}
	if c, err := ClaimTag(socket, api.ProtocolUDP, 53, "t"); err != nil {
		t.Errorf("root's claim beside nobody's directory: %v", err)
	} else {
		c.Release()
	}

	os.RemoveAll(path)
	squat := asNobody("flock", path, "sleep", "60") // nobody's file, locked
	if err := squat.Start(); err != nil {
		t.Fatal(err)
	}
	defer squat.Wait()
	defer squat.Process.Kill()
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil || time.Since(start) > 5*time.Second {
			break
		}
	}
	c, err := ClaimTag(socket, api.ProtocolUDP, 53, "t")
	if err != nil {
		t.Fatalf("root's claim beside nobody's locked file: %v", err)
	}
	defer c.Release()
	if out, err := asNobody("flock", "--nonblock", path, "true").CombinedOutput(); err == nil {
		t.Errorf("nobody locked root's claim file: %s", out)
	}

	planted := filepath.Join(api.ClaimsDir(socket), "udp-53-uid65534-t")
	if err := os.WriteFile(planted, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if line := holdClaimAsNobody(t, dir, socket); !strings.Contains(line, "is not a file of yours (owner uid 0)") {
		t.Errorf("nobody's claim where root put a file: %q, want refused naming its owner", line)
	}
}
