package daemon_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

// redialDriver is one client of santad across its restarts: it has added a
// rule, and lists the rule set's rules on the same client object each time
// it is asked, answering "listed <id> ..." or "error errno=<n> <text>".
type redialDriver interface {
	list(t *testing.T) string
}

// goDriver is the Go client, in this process.
type goDriver struct {
	c      *santa.Client
	target santa.Target
}

func (d *goDriver) list(t *testing.T) string {
	rules, err := d.c.ListRules(d.target)
	if err != nil {
		// the errno of the failed dial, which the error wraps beside
		// the lost connection's EPIPE
		var errno syscall.Errno
		errors.As(err, &errno)
		for _, e := range []syscall.Errno{syscall.ENOENT, syscall.ECONNREFUSED} {
			if errors.Is(err, e) {
				errno = e
			}
		}
		return fmt.Sprintf("error errno=%d %v", int(errno), err)
	}
	out := "listed"
	for _, r := range rules {
		out += fmt.Sprintf(" %d", r.ID)
	}
	return out
}

// procDriver is a C or Python driver program (testdata/redial_driver.*),
// asked for each listing by a line on its stdin.
type procDriver struct {
	stdin io.Writer
	lines chan string
	out   *testbed.LockedBuffer
}

func startProcDriver(t *testing.T, tb *testbed.Testbed, env []string, argv ...string) (*procDriver, string) {
	t.Helper()
	full := asUser(tb, 0, argv...)
	cmd := exec.Command(full[0], full[1:]...)
	cmd.Env = append(os.Environ(), env...)
	d := &procDriver{lines: make(chan string, 16), out: &testbed.LockedBuffer{}}
	cmd.Stderr = d.out
	t.Cleanup(func() { // after StartPiped's: the driver has exited
		if t.Failed() {
			t.Logf("%s stderr:\n%s", argv[0], d.out.String())
		}
	})
	var sc *bufio.Scanner
	d.stdin, sc = testbed.StartPiped(t, cmd)
	go func() {
		for sc.Scan() {
			d.lines <- sc.Text()
		}
		close(d.lines)
	}()
	return d, d.next(t)
}

func (d *procDriver) next(t *testing.T) string {
	t.Helper()
	select {
	case line, ok := <-d.lines:
		if !ok {
			t.Fatalf("the driver exited: %s", d.out.String())
		}
		return line
	case <-time.After(60 * time.Second):
		t.Fatalf("no line from the driver in 60 s: %s", d.out.String())
	}
	return ""
}

func (d *procDriver) list(t *testing.T) string {
	t.Helper()
	if _, err := io.WriteString(d.stdin, "list\n"); err != nil {
		t.Fatal(err)
	}
	return d.next(t)
}

// TestClientRedial restarts santad under a client of each library (Go, C,
// Python): the same client object goes on working, with the rule it added
// kept; while santad is stopped its call fails naming the lost connection
// and the failed connect, and once santad is back the next call works.
func TestClientRedial(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"SANTA_SOCKET=" + sd.Socket, "PYTHONPATH=" + filepath.Join(work, "python")}
	addr := tb.Server.IP4.String()
	for i, lang := range []string{"go", "c", "python"} {
		port := 7950 + i
		t.Run(lang, func(t *testing.T) {
			var d redialDriver
			var added string
			switch lang {
			case "go":
				c, err := santa.Dial(sd.Socket)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				_, target := serverSocket(t, tb, netip.AddrPortFrom(tb.Server.IP4, uint16(port)))
				ids, err := c.Add(target, []api.Rule{{
					Conditions: []api.Condition{santa.Match(0, []byte("ping"))},
					Processors: []api.Processor{santa.Put(0, []byte("pong"))},
					ReplyLen:   4,
				}})
				if err != nil {
					t.Fatal(err)
				}
				d, added = &goDriver{c: c, target: target}, fmt.Sprintf("added %d", ids[0])
			case "c":
				bin := filepath.Join(work, "redial-driver-c")
				cc := exec.Command("cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", filepath.Join(root, "clients/c/include"),
					filepath.Join(root, "internal/daemon/testdata/redial_driver.c"), "-o", bin,
					"-L", filepath.Join(work, "c"), "-lsanta", "-Wl,-rpath,"+filepath.Join(work, "c"))
				if out, err := cc.CombinedOutput(); err != nil {
					t.Fatalf("%v: %v\n%s", cc.Args, err, out)
				}
				d, added = startProcDriver(t, tb, env, bin, addr, fmt.Sprint(port))
			case "python":
				d, added = startProcDriver(t, tb, env, "/usr/bin/python3",
					filepath.Join(root, "internal/daemon/testdata/redial_driver.py"), addr, fmt.Sprint(port))
			}
			var id uint64
			if _, err := fmt.Sscanf(added, "added %d", &id); err != nil {
				t.Fatalf("driver: %q: %v", added, err)
			}
			want := fmt.Sprintf("listed %d", id)
			if got := d.list(t); got != want {
				t.Fatalf("before the restart: %q, want %q", got, want)
			}

			sd.stop(syscall.SIGTERM)
			sd.start()
			if got := d.list(t); got != want {
				t.Fatalf("after santad restarted: %q, want %q (the rule, on the same client)", got, want)
			}

			sd.stop(syscall.SIGTERM)
			got := d.list(t)
			var errno int
			fmt.Sscanf(got, "error errno=%d", &errno)
			if syscall.Errno(errno) != syscall.ENOENT && syscall.Errno(errno) != syscall.ECONNREFUSED {
				t.Errorf("while santad is stopped: %q, want an error with errno ENOENT or ECONNREFUSED", got)
			}
			for _, part := range []string{sd.Socket, "lost", "again failed"} {
				if !strings.Contains(got, part) {
					t.Errorf("while santad is stopped: %q does not say %q", got, part)
				}
			}

			sd.start()
			if got := d.list(t); got != want {
				t.Fatalf("after santad started again: %q, want %q", got, want)
			}
		})
	}
}
