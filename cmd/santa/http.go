package main

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/santa-offload/santa/api"
	followpkg "github.com/santa-offload/santa/integrations/follow"
	"github.com/santa-offload/santa/integrations/httpctl"
)

func httpCmd(e env, g *globals) *cobra.Command {
	cfg := httpctl.DefaultConfig
	var port, server string
	var duration time.Duration
	var verbose, follow bool
	cmd := &cobra.Command{
		Use:   "http --root DIR [--port 80] [--path PATH ...]",
		Short: "Offload the hot static GET and HEAD requests of an unmodified nginx over TCP (root)",
		Long: `santa http attaches to the TCP listening sockets of a running nginx through
santad and answers hot requests for static files from the rule processor.
A rule answers one exact request: every byte of its request line and
headers must match, and its reply is nginx's own response to those bytes,
which the controller fetches by sending them to nginx itself. Requests are
learned from the sockets' miss samples: those sampled at least
--min-samples times (counts halve every second), up to --max-rules, and
with --path only requests for those paths. Only GET and HEAD over HTTP/1.0
and HTTP/1.1 with a 200, 206 or 304 response of at most --max-reply bytes
are offloaded.

Each reply's Date is rewritten every second (--date-refresh). A change of a
file under --root (inotify) deletes its rules at once; they are fetched and
installed again once the file is quiet. Every rule is compared with nginx's
current response once per --interval. The controller deletes its rules
when it stops (SIGINT, SIGTERM, SIGHUP or --duration). Its rules are leased: each
answers for --lease after the controller last renewed it (when half is
left), so rules the controller could not delete (it was killed, or santad
went away) stop answering within --lease, santad running or not. It must
run in nginx's network namespace, next to santad. See docs/http.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := refuseNotPositive(cmd, "max-rules", "min-samples", "sample-rate", "max-reply", "interval", "lease", "settle", "timeout", "tag"); err != nil {
				return err
			}
			port = strings.ToLower(port) // 80/TCP too
			if strings.Contains(port, "/") && !strings.HasSuffix(port, "/tcp") {
				return fmt.Errorf("--port %q: nginx's HTTP is TCP: give the port alone or as PORT/tcp", port)
			}
			p, err := strconv.ParseUint(strings.TrimSuffix(port, "/tcp"), 10, 16)
			if err != nil || p == 0 {
				return fmt.Errorf("--port %q: want a number from 1 to 65535", port)
			}
			cfg.Port = uint16(p)
			if server != "" {
				if cfg.Server, err = netip.ParseAddrPort(server); err != nil {
					return fmt.Errorf("--server: %w", err)
				}
			}
			if cfg.Root == "" {
				return fmt.Errorf("give --root DIR, nginx's document root")
			}
			cfg.Socket = g.socketPath
			cfg.Log = controllerLog(e, verbose)
			cfg.Ready = func(r httpctl.Report) {
				fmt.Fprintf(e.stdout, "ready: learning on %d sockets of port %d\n", r.Sockets, cfg.Port)
			}
			return runController(e, func() (*httpctl.Controller, error) { return httpctl.New(cfg) }, duration,
				followpkg.Options{Follow: follow, Socket: cfg.Socket, Port: cfg.Port, Protocol: api.ProtocolTCP, Log: cfg.Log},
				func(r httpctl.Report) string {
					return fmt.Sprintf("done: installed %d, invalidated %d, changed %d, removed %d requests; dated %d, renewed %d rules; skipped %d (%d too big); %d failed fetches; %d hits; %d samples (%d ignored)",
						r.Installed, r.Invalidated, r.Changed, r.Removed, r.Dated, r.Renewed, r.Skipped, r.TooBig, r.FetchErrors, r.Hits, r.Samples, r.Ignored)
				})
		},
	}
	f := cmd.Flags()
	f.StringVar(&port, "port", "80", "nginx's TCP port: attach to every socket listening on it")
	f.StringVar(&server, "server", "", "send requests to this address to fetch responses (default: each listening socket's address, loopback for a wildcard)")
	f.StringVar(&cfg.Root, "root", "", "nginx's document root, watched for changes (required)")
	f.StringArrayVar(&cfg.Paths, "path", nil, "offload only requests for this path (repeatable; default: any path)")
	f.IntVar(&cfg.MaxRules, "max-rules", cfg.MaxRules, "offload at most this many distinct requests")
	f.Uint64Var(&cfg.MinSamples, "min-samples", cfg.MinSamples, "sampled misses a request needs to be offloaded")
	f.Uint32Var(&cfg.SampleRate, "sample-rate", cfg.SampleRate, "miss samples per second and CPU")
	f.IntVar(&cfg.MaxReply, "max-reply", cfg.MaxReply, "offload only responses of at most this many bytes, headers included (at most 14480, 10 segments; IPv6 listeners: 20 less per segment)")
	f.IntVar(&cfg.DateRefresh, "date-refresh", cfg.DateRefresh, "rewrite the Date of at most this many rules per second (0: keep the Date of the fetch)")
	f.DurationVar(&cfg.Interval, "interval", cfg.Interval, "compare every rule with nginx's current response once per this long")
	f.DurationVar(&cfg.Lease, "lease", cfg.Lease, "a rule answers this long after its last renewal: how long rules outlive a controller that could not delete them (at least 4s)")
	f.DurationVar(&cfg.Idle, "idle", cfg.Idle, "remove a rule after this long without hits (0: never)")
	f.DurationVar(&cfg.Settle, "settle", cfg.Settle, "after a file changes, fetch its responses again once it was quiet this long")
	f.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "wait this long for nginx's responses")
	f.DurationVar(&cfg.Report, "report", cfg.Report, "log a status line this often (0: never)")
	f.DurationVar(&duration, "duration", 0, "stop after this long (0: run until SIGINT or SIGTERM)")
	f.BoolVar(&verbose, "verbose", false, "log every request offloaded, not offloaded, or invalidated")
	f.StringVar(&cfg.Tag, "tag", cfg.Tag, "tag every rule with this: at start the controller takes over or deletes the rules with it on its sockets, which a predecessor left (two controllers on one port need different tags: a second one with this tag refuses to start while this one runs)")
	f.BoolVar(&follow, "follow", false, "when nginx closes its listening sockets (restart) or santad goes away or is not running yet, wait for it and attach again")
	return cmd
}
