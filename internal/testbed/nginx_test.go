//go:build linux

package testbed

import (
	"bytes"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// nginxTestFiles are a small page, a file in a subdirectory and 1 MB of
// random bytes.
func nginxTestFiles() map[string][]byte {
	big := make([]byte, 1<<20)
	rand.New(rand.NewSource(1)).Read(big)
	return map[string][]byte{
		"index.html":    []byte("<html><body>santa testbed</body></html>\n"),
		"sub/dir/a.txt": []byte("hello from a subdirectory\n"),
		"big.bin":       big,
	}
}

// curlGet fetches url with curl from the client namespace into a file and
// returns the body.
func curlGet(t *testing.T, tb *Testbed, url string) []byte {
	t.Helper()
	return curlGetWithin(t, tb, url, 20*time.Second)
}

// curlGetWithin is curlGet with curl's --max-time.
func curlGetWithin(t *testing.T, tb *Testbed, url string, d time.Duration) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "body")
	if _, err := tb.Client.Run("curl", "-sS", "--fail", "--max-time", strconv.Itoa(int(d.Seconds())), "-o", out, url); err != nil {
		t.Fatalf("curl %s: %v", url, err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestNginx serves files with sendfile off and on, over IPv4 and IPv6,
// fetches them with curl from the client namespace and stops nginx.
func TestNginx(t *testing.T) {
	files := nginxTestFiles()
	for _, sendfile := range []bool{false, true} {
		name := "sendfile-off"
		if sendfile {
			name = "sendfile-on"
		}
		t.Run(name, func(t *testing.T) {
			tb := New(t)
			start := time.Now()
			n, err := tb.StartNginx(NginxOptions{Files: files, Sendfile: sendfile, IPv6: true, Workers: 2, AccessLog: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("nginx pid %d answers after %v", n.PID(), time.Since(start).Round(time.Millisecond))
			if n.Addr4.Port() != 80 || n.Addr4.Addr() != tb.Server.IP4 || n.Addr6.Addr() != tb.Server.IP6 {
				t.Errorf("addresses %v %v", n.Addr4, n.Addr6)
			}
			conf, _ := os.ReadFile(n.Conf)
			if want := "sendfile " + map[bool]string{false: "off", true: "on"}[sendfile] + ";"; !strings.Contains(string(conf), want) {
				t.Errorf("config has no %q:\n%s", want, conf)
			}
			for _, url := range []func(string) string{n.URL4, n.URL6} {
				for path, want := range files {
					got := curlGet(t, tb, url("/"+path))
					if !bytes.Equal(got, want) {
						t.Errorf("%s: %d bytes, want %d (differ)", url("/"+path), len(got), len(want))
					}
				}
				if got := curlGet(t, tb, url("/")); !bytes.Equal(got, files["index.html"]) {
					t.Errorf("%s: %q", url("/"), got)
				}
			}
			out, err := tb.Client.Run("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5", n.URL4("/nonexistent"))
			if err != nil || out != "404" {
				t.Errorf("nonexistent: %q %v", out, err)
			}
			// 2 × (3 files, "/") + the 404; the readiness probes are not logged.
			if log := n.AccessLog(); strings.Count(log, "\n") != 9 || !strings.Contains(log, "GET /big.bin") || strings.Contains(log, "HEAD") {
				t.Errorf("access log, want 9 requests:\n%s", log)
			}

			pids, err := n.PIDs()
			if err != nil || len(pids) != 3 {
				t.Errorf("pids %v %v: want the master and 2 workers", pids, err)
			}
			start = time.Now()
			if err := n.Stop(); err != nil {
				t.Errorf("stop: %v", err)
			}
			t.Logf("nginx stopped in %v", time.Since(start).Round(time.Millisecond))
			if left := running(pids); len(left) > 0 {
				t.Errorf("nginx processes %v still running after Stop", left)
			}
			if _, err := os.Stat(n.Dir); err == nil {
				t.Errorf("%s still exists", n.Dir)
			}
			if err := n.Stop(); err != nil {
				t.Errorf("second Stop: %v", err)
			}
		})
	}
}

// TestNginxOptions: a caller's root, a port, pinning, keepalive_requests
// and extra configuration are applied; the testbed stops nginx on Close.
func TestNginxOptions(t *testing.T) {
	tb, err := Create(Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	root := t.TempDir() // 0700: readable only because the workers run as root
	if err := os.WriteFile(filepath.Join(root, "pre.txt"), []byte("there before\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n, err := tb.StartNginx(NginxOptions{
		Root: root, Files: map[string][]byte{"x.txt": []byte("x\n")},
		Port: 8080, KeepaliveRequests: 2, Pin: true, CPU: 0,
		ExtraConfig: "\t\tlocation = /hello { return 200 \"hi\\n\"; }",
	})
	if err != nil {
		t.Fatal(err)
	}
	if n.Addr6.IsValid() {
		t.Errorf("Addr6 %v without IPv6", n.Addr6)
	}
	for path, want := range map[string]string{"/pre.txt": "there before\n", "/x.txt": "x\n", "/hello": "hi\n"} {
		if got := string(curlGet(t, tb, n.URL4(path))); got != want {
			t.Errorf("%s: %q, want %q", path, got, want)
		}
	}
	// keepalive_requests 2: the third request on a connection needs a new one.
	out, err := tb.Client.Run("curl", "-sS", "--max-time", "5", "-o", "/dev/null", "-o", "/dev/null", "-o", "/dev/null",
		"-w", "%{num_connects} ", n.URL4("/x.txt"), n.URL4("/x.txt"), n.URL4("/x.txt"))
	if err != nil || out != "1 0 1 " {
		t.Errorf("connects per request %q (%v), want \"1 0 1 \"", out, err)
	}
	pids, err := n.PIDs()
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		tids, _ := Threads(pid)
		for _, tid := range tids {
			var set unix.CPUSet
			if err := unix.SchedGetaffinity(tid, &set); err != nil {
				t.Fatal(err)
			}
			if set.Count() != 1 || !set.IsSet(0) {
				t.Errorf("nginx thread %d of %d not pinned to cpu0", tid, pid)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(root, "x.txt")); err != nil {
		t.Error(err)
	}
	if err := tb.Close(); err != nil {
		t.Fatal(err)
	}
	if left := running(pids); len(left) > 0 {
		t.Errorf("nginx processes %v still running after the testbed closed", left)
	}
	if _, err := os.Stat(filepath.Join(root, "pre.txt")); err != nil {
		t.Errorf("the caller's root was touched: %v", err)
	}
}

// TestNginxStartFails: a configuration nginx rejects is reported with
// nginx's message at once.
func TestNginxStartFails(t *testing.T) {
	tb := New(t)
	start := time.Now()
	_, err := tb.StartNginx(NginxOptions{ExtraConfig: "no_such_directive on;", Timeout: 30 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "exited") || !strings.Contains(err.Error(), "no_such_directive") {
		t.Fatalf("err %v, want an exit with nginx's complaint", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("failure took %v", d)
	}
	if _, err := tb.StartNginx(NginxOptions{Files: map[string][]byte{"../escape": nil}}); err == nil {
		t.Error("a file outside the root was accepted")
	}
}

// TestNginxChromium loads a page with a script from nginx in headless
// Chromium run as root in the client namespace, with the flags it needs
// there: --no-sandbox (as root), and HOME and --user-data-dir in a temp
// dir so nothing is written to root's home.
func TestNginxChromium(t *testing.T) {
	if _, err := os.Stat("/usr/bin/chromium"); err != nil {
		t.Fatal("no /usr/bin/chromium: run scripts/install-deps.sh")
	}
	tb := New(t)
	page := `<html><body><p id="x">static</p><script>document.getElementById("x").textContent = "script ran";</script></body></html>`
	n, err := tb.StartNginx(NginxOptions{Files: map[string][]byte{"index.html": []byte(page)}, IPv6: true})
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	for _, url := range []string{n.URL4("/"), n.URL6("/")} {
		out, err := tb.Client.Run("env", "HOME="+home, "timeout", "60", "chromium",
			"--headless=new", "--no-sandbox", "--user-data-dir="+filepath.Join(home, "profile"),
			"--dump-dom", url)
		if err != nil {
			t.Fatalf("chromium: %v", err)
		}
		if !strings.Contains(out, `<p id="x">script ran</p>`) {
			t.Errorf("%s: DOM without the script's change:\n%s", url, out)
		}
	}
}
