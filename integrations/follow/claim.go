package follow

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/clients/go/santa"
)

// ErrTagClaimed is why a controller refuses to start: another one runs
// with its tag on its port. Both would take the rules of the tag as their
// own (Inherit), and each would delete the other's.
var ErrTagClaimed = errors.New("two controllers on one port need different tags (--tag)")

// Claim is a running controller's hold on its tag on its port: an
// exclusive flock, as santad holds its own lock, on a file in santad's run
// directory (that of its control socket). The kernel drops it when the
// controller exits, however it ends, so a controller killed with SIGKILL
// leaves nothing that keeps the next one from starting and taking over
// the rules it left.
type Claim struct{ file *os.File }

// ClaimTag claims tag on port (api.ProtocolUDP or api.ProtocolTCP) of
// santad at socketPath ("": santa.SocketPath()) for this controller, until
// Release. It fails with ErrTagClaimed, naming the holder's pid, while
// another controller holds the claim.
func ClaimTag(socketPath string, protocol uint32, port uint16, tag string) (*Claim, error) {
	if socketPath == "" {
		socketPath = santa.SocketPath()
	}
	proto := "UDP"
	if protocol == api.ProtocolTCP {
		proto = "TCP"
	}
	if err := api.MakeClaimsDir(socketPath); errors.Is(err, fs.ErrNotExist) {
		// no directory for santad's socket: santad has not run there
		return nil, fmt.Errorf("connect to santad at %s: %w (is santad running? see docs/operations.md)", socketPath, err)
	} else if err != nil {
		return nil, fmt.Errorf("claim tag %q: %w", tag, err)
	}
	// a claim per user: a user's controller sees only the rules that user
	// may manage, and must not be able to block another user's tag
	name := fmt.Sprintf("%s-%d-uid%d-%s", strings.ToLower(proto), port, os.Geteuid(), url.PathEscape(tag))
	path := filepath.Join(api.ClaimsDir(socketPath), name)
	f, err := openOwnClaim(path)
	if err != nil {
		return nil, fmt.Errorf("claim tag %q: %w", tag, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("claim tag %q: lock %s: %w", tag, path, err)
		}
		holder := "pid unknown" // the holder has not written it yet
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			holder = "pid " + strings.TrimSpace(string(b))
		}
		return nil, fmt.Errorf("another controller (%s) runs with tag %q on %s port %d (%s): %w",
			holder, tag, proto, port, path, ErrTagClaimed)
	}
	// the pid only names the holder in the message of a controller refused
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return &Claim{file: f}, nil
}

// openOwnClaim opens the claim file at path, a file of this user's that
// only this user may open. The directory is writable by every user
// (sticky, as /tmp), so another may have put something at path first: a
// symlink, which must not be followed (root's controller would truncate
// the file it names), or a file of its own, held locked to keep this
// controller from starting, or a directory with files in it. root removes
// any of them (RemoveAll follows no symlink); another user is refused,
// naming the owner.
func openOwnClaim(path string) (*os.File, error) {
	if fi, err := os.Lstat(path); err == nil && !ownedRegular(fi) {
		if os.Geteuid() != 0 {
			return nil, fmt.Errorf("%s is not a file of yours (owner uid %d): another user put it there; remove it",
				path, fi.Sys().(*syscall.Stat_t).Uid)
		}
		if err := os.RemoveAll(path); err != nil {
			return nil, err
		}
	}
	// O_NOFOLLOW and the check after it: something put there meanwhile is refused
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && !ownedRegular(fi) {
		err = fmt.Errorf("%s was replaced by another user's while it was opened", path)
	}
	if err == nil {
		err = f.Chmod(0o600) // a claim file of an older version was readable by all, so lockable by all
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// ownedRegular says fi is a regular file of this process's user.
func ownedRegular(fi os.FileInfo) bool {
	return fi.Mode().IsRegular() && fi.Sys().(*syscall.Stat_t).Uid == uint32(os.Geteuid())
}

// Release gives the claim up: the controller has deleted its rules, or
// leaves them for the next one with its tag to take over.
func (c *Claim) Release() { c.file.Close() }
