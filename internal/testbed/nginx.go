//go:build linux

package testbed

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// NginxPath is Debian's nginx (package nginx); NginxMimeTypes is the only
// file of /etc/nginx the generated configuration uses.
var (
	NginxPath      = "/usr/sbin/nginx"
	NginxMimeTypes = "/etc/nginx/mime.types"
)

// NginxOptions configure StartNginx. The zero value serves a new, empty
// document root on port 80 of the server's IPv4 address with one worker,
// sendfile off, no access log, unpinned.
type NginxOptions struct {
	// Root is the document root. Empty: a new directory under Dir, removed
	// by Stop. A directory of the caller is left in place; it must be
	// readable by root (the workers run as root).
	Root string
	// Files are written into Root before nginx starts, by slash-separated
	// path relative to Root ("index.html", "a/b.bin"); directories are
	// created as needed.
	Files    map[string][]byte
	Port     int  // TCP port; 0: 80
	Sendfile bool // sendfile on (off: nginx copies through user space)
	Workers  int  // worker_processes; 0: 1
	// WorkerConnections is worker_connections; 0: 1024.
	WorkerConnections int
	// KeepaliveRequests is keepalive_requests, the requests served on one
	// connection before nginx closes it; 0: nginx's default (1000).
	// Benchmarks that keep connections open set it high (e.g. 1000000).
	KeepaliveRequests int
	// AccessLog writes an access log (AccessLogFile); off by default.
	AccessLog bool
	// IPv6 also listens on [::]:Port (Addr6 is invalid without it).
	IPv6 bool
	// Reuseport listens with reuseport: a socket of its own per worker
	// and address, so that a reload with more workers opens more.
	Reuseport bool
	// Pin starts nginx under taskset, so master and workers run only on
	// CPU.
	Pin bool
	CPU int
	// ExtraConfig is added verbatim inside the server { } block (location
	// blocks, tcp_nodelay, add_header, …); ExtraHTTPConfig inside the
	// http { } block, before the server (map, upstream, …).
	ExtraConfig     string
	ExtraHTTPConfig string
	// Timeout to wait until nginx answers; 0: 10 s.
	Timeout time.Duration
}

// Nginx is a running nginx in the server namespace of a testbed.
type Nginx struct {
	Addr4, Addr6  netip.AddrPort // the server's addresses; Addr6 only with IPv6
	Dir           string         // temp dir: config, pid file, logs, temp paths
	Conf          string         // path of nginx.conf
	Root          string         // the document root
	ErrorLogFile  string
	AccessLogFile string // "" unless AccessLog

	workers int
	ownRoot bool
	serverProcess
}

// StartNginx writes a complete nginx.conf under a new temp dir (nothing
// of /etc/nginx is used but mime.types) and starts nginx in the server
// namespace as `nginx -p DIR/ -c DIR/nginx.conf -e DIR/error.log`, with
// `daemon off; master_process on;` and the workers running as root. It
// returns once nginx answers an HTTP request over TCP from the client
// namespace on every address it listens on (HEAD /.santa-testbed-ready,
// a location of the generated config that answers 204 and is not logged)
// and all workers are up. nginx is stopped by Stop or when the testbed
// closes.
func (tb *Testbed) StartNginx(o NginxOptions) (*Nginx, error) {
	if o.Port == 0 {
		o.Port = 80
	}
	if o.Workers <= 0 {
		o.Workers = 1
	}
	if o.WorkerConnections <= 0 {
		o.WorkerConnections = 1024
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	dir, err := os.MkdirTemp("", "santa-nginx-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	n := &Nginx{
		Addr4:        netip.AddrPortFrom(tb.Server.IP4, uint16(o.Port)),
		Dir:          dir,
		Conf:         filepath.Join(dir, "nginx.conf"),
		Root:         o.Root,
		ErrorLogFile: filepath.Join(dir, "error.log"),
		workers:      o.Workers,
	}
	if o.IPv6 {
		n.Addr6 = netip.AddrPortFrom(tb.Server.IP6, uint16(o.Port))
	}
	if o.AccessLog {
		n.AccessLogFile = filepath.Join(dir, "access.log")
	}
	fail := func(err error) (*Nginx, error) {
		n.Stop()
		return nil, fmt.Errorf("nginx: %w", err)
	}
	if n.Root == "" {
		n.Root = filepath.Join(dir, "root")
		n.ownRoot = true
		if err := os.Mkdir(n.Root, 0o755); err != nil {
			return fail(err)
		}
	}
	if err := writeFiles(n.Root, o.Files); err != nil {
		return fail(err)
	}
	if err := os.WriteFile(n.Conf, []byte(n.config(tb, o)), 0o644); err != nil {
		return fail(err)
	}

	// with daemon off the master stays in the foreground: the server's pid is the master's
	if err := n.start(tb, dir, o.Pin, o.CPU, []string{NginxPath, "-p", dir + "/", "-c", n.Conf, "-e", n.ErrorLogFile}); err != nil {
		return fail(err)
	}
	tb.addCleanup(n.Stop)

	if err := n.waitReady(tb, o.Timeout); err != nil {
		return fail(err)
	}
	return n, nil
}

// writeFiles writes files (slash-separated paths relative to root) under
// root.
func writeFiles(root string, files map[string][]byte) error {
	for name, data := range files {
		rel := filepath.FromSlash(name)
		if name == "" || filepath.IsAbs(rel) || !filepath.IsLocal(rel) {
			return fmt.Errorf("file %q: not a relative path inside the document root", name)
		}
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// config is the complete nginx.conf.
func (n *Nginx) config(tb *Testbed, o NginxOptions) string {
	onOff := func(b bool) string {
		if b {
			return "on"
		}
		return "off"
	}
	d := n.Dir
	var c strings.Builder
	fmt.Fprintf(&c, `# Written by internal/testbed for testbed %s.
daemon off;
master_process on;
user root;
worker_processes %d;
pid %s/nginx.pid;
lock_file %s/nginx.lock;
error_log %s notice;

events {
	worker_connections %d;
}

http {
	include %s;
	default_type application/octet-stream;
	server_tokens off;
	sendfile %s;
`, tb.ID, o.Workers, d, d, n.ErrorLogFile, o.WorkerConnections, NginxMimeTypes, onOff(o.Sendfile))
	if n.AccessLogFile != "" {
		fmt.Fprintf(&c, "\taccess_log %s;\n", n.AccessLogFile)
	} else {
		c.WriteString("\taccess_log off;\n")
	}
	if o.KeepaliveRequests > 0 {
		fmt.Fprintf(&c, "\tkeepalive_requests %d;\n", o.KeepaliveRequests)
	}
	for _, t := range []string{"client_body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		fmt.Fprintf(&c, "\t%s_temp_path %s/%s_temp;\n", t, d, t)
	}
	if o.ExtraHTTPConfig != "" {
		fmt.Fprintf(&c, "%s\n", o.ExtraHTTPConfig)
	}
	reuseport := ""
	if o.Reuseport {
		reuseport = " reuseport"
	}
	fmt.Fprintf(&c, "\n\tserver {\n\t\tlisten %d%s;\n", o.Port, reuseport)
	if o.IPv6 {
		fmt.Fprintf(&c, "\t\tlisten [::]:%d ipv6only=on%s;\n", o.Port, reuseport)
	}
	fmt.Fprintf(&c, "\t\tserver_name _;\n\t\troot %s;\n\t\tindex index.html;\n", n.Root)
	// StartNginx's readiness probe: not in the access log.
	fmt.Fprintf(&c, "\t\tlocation = %s { access_log off; return 204; }\n", nginxReadyPath)
	if o.ExtraConfig != "" {
		fmt.Fprintf(&c, "%s\n", o.ExtraConfig)
	}
	c.WriteString("\t}\n}\n")
	return c.String()
}

// waitReady polls until nginx answers an HTTP request on each address from
// the client namespace and all workers have been started.
func (n *Nginx) waitReady(tb *Testbed, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, a := range []netip.AddrPort{n.Addr4, n.Addr6} {
		if !a.IsValid() {
			continue
		}
		for {
			select {
			case <-n.done:
				return fmt.Errorf("exited: %v: %s%s", n.werr, n.out.String(), n.Log())
			default:
			}
			err := tb.Client.Do(func() error { return httpProbe(a, time.Second) })
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("no HTTP answer from %v within %v (last: %v): %s%s", a, timeout, err, n.out.String(), n.Log())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	var pids []int
	if !waitFor(time.Until(deadline), 20*time.Millisecond, func() bool {
		pids, _ = n.PIDs()
		return len(pids) >= 1+n.workers
	}) {
		return fmt.Errorf("%d processes (%v) within %v, want the master and %d workers", len(pids), pids, timeout, n.workers)
	}
	return nil
}

// nginxReadyPath is the location StartNginx polls until nginx answers. It
// answers 204 and is left out of the access log, so tests that count the
// requests nginx saw do not see the probes.
const nginxReadyPath = "/.santa-testbed-ready"

// httpProbe sends "HEAD <nginxReadyPath> HTTP/1.0" to a and accepts any
// HTTP status line.
func httpProbe(a netip.AddrPort, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", a.String(), timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("HEAD " + nginxReadyPath + " HTTP/1.0\r\n\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "HTTP/1.") {
		return fmt.Errorf("not an HTTP status line: %q", line)
	}
	return nil
}

// URL4 is http://<server IPv4>:<port><path>; path should start with "/".
func (n *Nginx) URL4(path string) string { return "http://" + n.Addr4.String() + path }

// URL6 is http://[<server IPv6>]:<port><path> (only with IPv6).
func (n *Nginx) URL6(path string) string { return "http://" + n.Addr6.String() + path }

// PID is the master process.

// PIDs returns the master and its descendants (the workers).
func (n *Nginx) PIDs() ([]int, error) {
	if !n.Running() {
		return nil, errors.New("nginx is not running")
	}
	return Descendants(n.PID())
}

// Log returns the contents of nginx's error log.
func (n *Nginx) Log() string {
	b, _ := os.ReadFile(n.ErrorLogFile)
	return string(b)
}

// AccessLog returns the contents of the access log ("" without AccessLog).
func (n *Nginx) AccessLog() string {
	if n.AccessLogFile == "" {
		return ""
	}
	b, _ := os.ReadFile(n.AccessLogFile)
	return string(b)
}

// Output returns what nginx wrote to stdout and stderr (the first MiB).
func (n *Nginx) Output() string { return n.out.String() }

// nginxQuitGrace is how long Stop waits for a graceful shutdown (SIGQUIT:
// finish the requests in progress) and then for a fast one (SIGTERM).
const nginxQuitGrace = 5 * time.Second

// Stop shuts nginx down: SIGQUIT (graceful), after 5 s SIGTERM (fast),
// after another 5 s SIGKILL to its process group; workers left in the
// group are killed. It removes Dir (and so a Root it made). Safe to call
// more than once; the testbed calls it on Close.
func (n *Nginx) Stop() error {
	n.stopOnce.Do(func() {
		defer os.RemoveAll(n.Dir)
		if !n.Running() {
			return
		}
		pgid := n.PID() // Setpgid: the group is this nginx's own
		procs, _ := Descendants(pgid)
		wait := func(d time.Duration) bool {
			select {
			case <-n.done:
				return true
			case <-time.After(d):
				return false
			}
		}
		_ = n.cmd.Process.Signal(syscall.SIGQUIT)
		if !wait(nginxQuitGrace) {
			_ = n.cmd.Process.Signal(syscall.SIGTERM)
			n.stopErr = fmt.Errorf("nginx did not quit on SIGQUIT within %v", nginxQuitGrace)
			if !wait(nginxQuitGrace) {
				_ = syscall.Kill(-pgid, syscall.SIGKILL) // the master is still there: the group is ours
				<-n.done
				n.stopErr = fmt.Errorf("nginx did not stop on SIGQUIT and SIGTERM within %v; killed", 2*nginxQuitGrace)
			}
		}
		n.killStragglers(procs[1:])
	})
	return n.stopErr
}
