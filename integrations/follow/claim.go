package follow

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
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
// the rules it left. The file also keeps the rule sets the holder's attach
// made (RecordCreated), for the next holder to take over: santad tells only
// the bind that makes a rule set so, and a rule set left without rules
// stays bound until somebody unbinds it.
type Claim struct {
	file *os.File
	tag  string
	// created are the rule sets the last holder recorded, read when claimed
	created []uint64
}

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
			pid, _, _ := strings.Cut(string(b), "\n")
			holder = "pid " + pid
		}
		return nil, fmt.Errorf("another controller (%s) runs with tag %q on %s port %d (%s): %w",
			holder, tag, proto, port, path, ErrTagClaimed)
	}
	c := &Claim{file: f, tag: tag, created: recordedCreated(f)}
	// the pid only names the holder in the message of a controller refused
	if err := c.RecordCreated(c.created); err != nil {
		f.Close()
		return nil, fmt.Errorf("claim tag %q: %w", tag, err)
	}
	return c, nil
}

// createdPrefix starts the claim file's line of the rule sets its holder
// made, after the line of its pid.
const createdPrefix = "created"

// recordedCreated reads the rule sets the claim file's last holder recorded.
func recordedCreated(f *os.File) []uint64 {
	b, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<20))
	if err != nil {
		return nil
	}
	var cookies []uint64
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] != createdPrefix {
			continue
		}
		for _, field := range fields[1:] {
			if cookie, err := strconv.ParseUint(field, 10, 64); err == nil {
				cookies = append(cookies, cookie)
			}
		}
	}
	return cookies
}

// Created are the rule sets (socket cookies) the claim's last holder
// recorded as made by its attach and not unbound again: a predecessor that
// was killed, or that left its rules because santad went away.
func (c *Claim) Created() []uint64 { return c.created }

// TakeOverCreated returns created, this holder's own rule sets, with
// those the claim's last holder recorded that are still bound where this
// holder may unbind them (bound), and records them all for the next
// holder. Santad told only the predecessor's bind that it made them, so
// they would stay bound, without rules, for good; now they are this
// holder's to unbind on exit when empty. Other rule sets, another
// program's or another tag's controller's, are not among them.
func (c *Claim) TakeOverCreated(created []uint64, bound func(cookie uint64) bool, log *slog.Logger) ([]uint64, error) {
	taken := 0
	for _, cookie := range c.created {
		if bound(cookie) && !slices.Contains(created, cookie) {
			created = append(created, cookie)
			taken++
		}
	}
	if taken > 0 {
		log.Info("taking over the rule sets a predecessor made", "tag", c.tag, "rule_sets", taken)
	}
	if err := c.RecordCreated(created); err != nil {
		return created, fmt.Errorf("record the rule sets made in the claim file: %w", err)
	}
	return created, nil
}

// BoundRuleSets says which rule sets santad holds now (for TakeOverCreated).
func BoundRuleSets(client *santa.Client) (func(cookie uint64) bool, error) {
	socks, err := client.ListSockets()
	if err != nil {
		return nil, fmt.Errorf("list the rule sets: %w", err)
	}
	bound := map[uint64]bool{}
	for _, s := range socks {
		bound[s.Cookie] = true
	}
	return func(cookie uint64) bool { return bound[cookie] }, nil
}

// RecordCreated records cookies as the rule sets this holder's attach made
// (and those of its predecessor it took over), for the next holder should
// this one leave them bound: record none once they are unbound.
func (c *Claim) RecordCreated(cookies []uint64) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%d\n%s", os.Getpid(), createdPrefix)
	for _, cookie := range cookies {
		fmt.Fprintf(&b, " %d", cookie)
	}
	b.WriteString("\n")
	if err := c.file.Truncate(0); err != nil {
		return err
	}
	_, err := c.file.WriteAt([]byte(b.String()), 0)
	return err
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
