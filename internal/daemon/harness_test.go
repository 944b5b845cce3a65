package daemon_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

// work is a directory every test user can read, with the binaries and
// client packages the tests run (the clone may sit where uid nobody cannot look).
var work string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "internal/daemon tests need root (XDP, namespaces, bpffs)")
		return 1
	}
	var err error
	if work, err = os.MkdirTemp("/run", "santa-test-"); err == nil {
		err = os.Chmod(work, 0o755)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(work)
	if err := buildAll(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// buildAll builds santad, the CLI and the three clients' Listing 1 examples into work.
func buildAll() error {
	root, err := filepath.Abs("../..")
	if err != nil {
		return err
	}
	steps := [][]string{
		{"go", "build", "-o", filepath.Join(work, "santad"), "./cmd/santad"},
		{"go", "build", "-o", filepath.Join(work, "santa"), "./cmd/santa"},
		{"go", "build", "-o", filepath.Join(work, "listing1-go"), "./clients/go/examples/listing1"},
		{"make", "-s", "-C", "clients/c", "all", "integration"},
		{"cp", "-r", "clients/c/build", filepath.Join(work, "c")},
		{"cp", "-r", "clients/python", filepath.Join(work, "python")},
		{"chmod", "-R", "a+rX", work},
	}
	for _, s := range steps {
		cmd := exec.Command(s[0], s[1:]...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v\n%s", strings.Join(s, " "), err, out)
		}
	}
	return nil
}

// santadProc is a santad running in the server namespace of a testbed, with
// its own control socket, pin directory and state directory.
type santadProc struct {
	*testbed.Santad
	t       testing.TB
	tb      *testbed.Testbed
	dir     string
	Metrics string
}

// newSantad configures (not starts) a santad for tb; extra are more flags.
func newSantad(t testing.TB, tb *testbed.Testbed, extra ...string) *santadProc {
	dir, err := os.MkdirTemp(work, "santad-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	s := &santadProc{t: t, tb: tb, dir: dir, Metrics: "127.0.0.1:9477"}
	s.Santad = testbed.NewSantad(filepath.Join(work, "santad"), tb.Server.NS, dir, "/sys/fs/bpf/"+filepath.Base(dir),
		append([]string{"--interface", tb.Server.Dev, "--metrics", s.Metrics, "--log-level", "debug"}, extra...)...)
	t.Cleanup(func() {
		if err := errors.Join(s.Stop(syscall.SIGKILL), s.Cleanup()); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("santad log:\n%s", s.Log())
		}
	})
	return s
}

// start runs santad and waits until it answers health.
func (s *santadProc) start() {
	s.t.Helper()
	if err := s.Start(context.Background()); err != nil {
		s.t.Fatal(err)
	}
}

// stop sends sig to santad and waits for it to exit.
func (s *santadProc) stop(sig syscall.Signal) {
	if err := s.Stop(sig); err != nil {
		s.t.Error(err)
	}
}

func (s *santadProc) client() *santa.Client {
	s.t.Helper()
	c, err := santa.Dial(s.Socket)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { c.Close() })
	return c
}

// cli runs the santa CLI in the server namespace as uid (0 = root).
func (s *santadProc) cli(uid int, args ...string) (string, error) {
	return runAs(s.tb, uid, nil, filepath.Join(work, "santa"), append([]string{"--socket-path", s.Socket}, args...)...)
}

// asUser is the command line that runs argv in the server namespace as uid.
func asUser(tb *testbed.Testbed, uid int, argv ...string) []string {
	pre := []string{"nsenter", "--net=/run/netns/" + tb.Server.NS}
	if uid != 0 {
		pre = append(pre, "setpriv", "--reuid="+strconv.Itoa(uid), "--regid="+strconv.Itoa(uid), "--clear-groups", "--")
	}
	return append(pre, argv...)
}

func runAs(tb *testbed.Testbed, uid int, env []string, name string, args ...string) (string, error) {
	argv := asUser(tb, uid, append([]string{name}, args...)...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, out)
	}
	return string(out), nil
}

// app is an example server (a Listing 1) running in the server namespace.
type app struct {
	cmd    *exec.Cmd
	Cookie uint64
	Rule   uint64
	out    *testbed.LockedBuffer
}

// startApp runs argv as uid and waits for its "ready cookie=N rule=ID" line.
func startApp(t *testing.T, tb *testbed.Testbed, uid int, env []string, argv ...string) *app {
	t.Helper()
	full := asUser(tb, uid, argv...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	cmd := exec.CommandContext(ctx, full[0], full[1:]...)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	a := &app{cmd: cmd, out: &testbed.LockedBuffer{}}
	cmd.Stderr = a.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		cancel()
	})
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "ready ") {
				ready <- sc.Text()
			}
			a.out.Write(append(sc.Bytes(), '\n'))
		}
		close(ready)
	}()
	select {
	case line, ok := <-ready:
		if !ok {
			cmd.Wait()
			t.Fatalf("%s exited before ready: %s", strings.Join(argv, " "), a.out.String())
		}
		if _, err := fmt.Sscanf(line, "ready cookie=%d rule=%d", &a.Cookie, &a.Rule); err != nil {
			t.Fatalf("bad ready line %q: %v", line, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s not ready in 30 s: %s", strings.Join(argv, " "), a.out.String())
	}
	return a
}

// exchange sends payload from the client namespace to server and returns the reply.
func exchange(t *testing.T, tb *testbed.Testbed, server netip.AddrPort, payload string) string {
	t.Helper()
	reply := exchangeOnce(tb, server, payload)
	if reply == "" {
		t.Fatalf("no reply from %v to %q", server, payload)
	}
	return reply
}

// exchangeOnce is exchange for any goroutine: it returns "" on failure.
func exchangeOnce(tb *testbed.Testbed, server netip.AddrPort, payload string) string {
	c, err := tb.DialUDP(server)
	if err != nil {
		return ""
	}
	defer c.Close()
	buf := make([]byte, 2048)
	for try := 0; try < 3; try++ {
		if _, err := c.Write([]byte(payload)); err != nil {
			return ""
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if n, err := c.Read(buf); err == nil {
			return string(buf[:n])
		}
	}
	return ""
}

// addPingPong gives target the rule that answers "ping" with "pong".
func addPingPong(t *testing.T, c *santa.Client, target santa.Target) {
	t.Helper()
	if _, err := c.Add(target, []api.Rule{{
		Conditions: []api.Condition{santa.Match(0, []byte("ping"))},
		Processors: []api.Processor{santa.Put(0, []byte("pong"))},
		ReplyLen:   4,
	}}); err != nil {
		t.Fatal(err)
	}
}

// scrape reads santad's Prometheus endpoint from inside the server namespace.
func (s *santadProc) scrape() string {
	s.t.Helper()
	var body string
	if err := s.tb.Server.Do(func() error {
		// dial here: the connection must be made inside the server namespace
		conn, err := net.Dial("tcp", s.Metrics)
		if err != nil {
			return err
		}
		defer conn.Close()
		if _, err := conn.Write([]byte("GET /metrics HTTP/1.0\r\n\r\n")); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return err
	}); err != nil {
		s.t.Fatal(err)
	}
	return body
}
