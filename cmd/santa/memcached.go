package main

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/santa-offload/santa/api"
	followpkg "github.com/santa-offload/santa/integrations/follow"
	"github.com/santa-offload/santa/integrations/mcctl"
)

// memcachedFlags are the options every `santa memcached` mode takes.
type memcachedFlags struct {
	port, tcpPort string
	server        string
	duration      time.Duration
	verbose       bool
	follow        bool
	cfg           mcctl.Config
}

func memcachedCmd(e env, g *globals) *cobra.Command {
	f := &memcachedFlags{cfg: mcctl.DefaultConfig}
	cmd := &cobra.Command{
		Use:   "memcached",
		Short: "Offload the GETs of hot keys of an unmodified memcached over UDP (root)",
		Long: `santa memcached attaches to the UDP sockets of a running memcached (-U) through
santad and answers plain UDP GETs of hot keys from XDP: it fetches each value
from memcached itself and installs a rule that sends memcached's reply, byte
for byte, with the request's id. A write tracker at TC ingress and egress of
every interface sees each write (set, add, replace, append, prepend, cas,
incr, decr, delete, touch, gat, flush_all; text, meta and binary protocol;
TCP and UDP) and retires the key's rule before memcached sees the write and
again when memcached's reply leaves, so no GET is answered from the kernel
with a value older than a write whose reply a client has. Rules whose value
changed are rebuilt within --refresh. It deletes its rules when it stops
(SIGINT, SIGTERM, SIGHUP or --duration). It must run in memcached's network
namespace, next to santad. See docs/memcached.md.

Modes:
  static    the keys of a file
  top       the N first keys of a ranked key list
  adaptive  the keys that miss most often, learned from miss samples`,
	}
	cmd.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		return refuseNotPositive(cmd, "guards", "refresh", "settle", "batch", "timeout", "tag", "count", "max-rules", "min-samples", "idle", "sample-rate")
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.port, "port", "11211/udp", "memcached's UDP port (its -U): attach to every socket bound to it")
	pf.StringVar(&f.tcpPort, "tcp-port", "", "memcached's TCP port (its -p), to fetch values from (default: the UDP port)")
	pf.StringVar(&f.server, "server", "", "fetch values from this TCP address (default: the UDP sockets' bound address, loopback for a wildcard, with the TCP port)")
	pf.StringVar(&f.cfg.GuardsPin, "guards", f.cfg.GuardsPin, "santad's guard map (<santad --bpffs>/guards)")
	pf.StringSliceVar(&f.cfg.Interfaces, "interface", nil, "put the write tracker on these interfaces, and on lo, which writes from this host take (default: every interface of the namespace)")
	pf.DurationVar(&f.cfg.Interval, "refresh", f.cfg.Interval, "how often to look for rules a write retired, and rebuild them, while writes come (after a quiet spell: within 200 ms)")
	pf.DurationVar(&f.cfg.Settle, "settle", f.cfg.Settle, "retire a key's rules once more this long after a write of it that gets no reply (noreply, quiet, reset connection): memcached has applied it by then")
	pf.IntVar(&f.cfg.Batch, "batch", f.cfg.Batch, "keys per fetch and per request to santad")
	pf.DurationVar(&f.cfg.Timeout, "timeout", f.cfg.Timeout, "wait this long for memcached's replies")
	pf.DurationVar(&f.duration, "duration", 0, "stop after this long (0: run until SIGINT or SIGTERM)")
	pf.StringVar(&f.cfg.Tag, "tag", f.cfg.Tag, "tag every rule with this: at start the controller takes over or deletes the rules with it on its sockets, which a predecessor left (two controllers on one port need different tags: a second one with this tag refuses to start while this one runs)")
	pf.BoolVar(&f.follow, "follow", false, "when memcached closes its sockets (restart) or santad goes away or is not running yet, wait for it and attach again")
	pf.BoolVar(&f.verbose, "verbose", false, "log every key not offloaded")

	var keysFile string
	static := &cobra.Command{
		Use:   "static --keys FILE",
		Short: "Offload the GETs of the keys in a file",
		Long: `--keys reads one key per line (- for stdin; blank lines and lines starting
with # are skipped). Keys memcached does not hold yet are tried again every
second.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			keys, err := readKeys(keysFile)
			if err != nil {
				return err
			}
			return f.run(e, g, mcctl.Static, keys)
		},
	}
	static.Flags().StringVar(&keysFile, "keys", "", "file of keys, one per line (- for stdin)")

	var topFile string
	top := &cobra.Command{
		Use:   "top --keys FILE --count N",
		Short: "Offload the GETs of the N most popular keys of a ranked list",
		Long: `--keys reads lines "KEY [COUNT]": with counts the list is ranked by count, without
them by order. The N first are offloaded (the paper's a-priori top-N).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.cfg.MaxRules <= 0 {
				return errors.New("--count must be at least 1")
			}
			keys, err := readKeys(topFile)
			if err != nil {
				return err
			}
			return f.run(e, g, mcctl.Top, keys)
		},
	}
	top.Flags().StringVar(&topFile, "keys", "", "ranked key list: KEY [COUNT] per line (- for stdin)")
	top.Flags().IntVar(&f.cfg.MaxRules, "count", f.cfg.MaxRules, "how many of the most popular keys to offload")

	adaptive := &cobra.Command{
		Use:   "adaptive",
		Short: "Offload the GETs of the keys that miss most often, learned from miss samples",
		Long: `adaptive subscribes to the sockets' miss samples, counts the keys of missed
GETs in a heavy-hitter sketch (Space-Saving, halved every second), offloads
those seen at least --min-samples times, up to --max-rules, and removes
rules without hits for --idle.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return f.run(e, g, mcctl.Adaptive, nil) },
	}
	adaptive.Flags().IntVar(&f.cfg.MaxRules, "max-rules", f.cfg.MaxRules, "offload at most this many keys")
	adaptive.Flags().Uint64Var(&f.cfg.MinSamples, "min-samples", f.cfg.MinSamples, "sampled misses a key needs to be offloaded")
	adaptive.Flags().DurationVar(&f.cfg.Idle, "idle", f.cfg.Idle, "remove a rule after this long without hits")
	adaptive.Flags().Uint32Var(&f.cfg.SampleRate, "sample-rate", f.cfg.SampleRate, "miss samples per second and CPU")

	cmd.AddCommand(static, top, adaptive)
	return cmd
}

// readKeys reads a key list: the first field of each line, in order, ranked
// by a second field (a count) where every line has one. A key listed again
// is one key, at its first place, with its counts added up.
func readKeys(path string) ([]string, error) {
	if path == "" {
		return nil, errors.New("give --keys FILE")
	}
	var r io.Reader = os.Stdin
	if path != "-" {
		fh, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer fh.Close()
		r = fh
	}
	type ranked struct {
		key   string
		count uint64
	}
	var list []ranked
	at := map[string]int{} // a key's place in list: listed again, its counts add up
	counted := true
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		var c uint64
		switch len(fields) {
		case 1:
			counted = false
		case 2:
			if _, err := fmt.Sscan(fields[1], &c); err != nil {
				return nil, fmt.Errorf("%s:%d: count %q is not a number (a line is KEY [COUNT]; a memcached key has no spaces)", path, n, fields[1])
			}
		default:
			return nil, fmt.Errorf("%s:%d: want KEY [COUNT], got %d fields", path, n, len(fields))
		}
		if i, ok := at[fields[0]]; ok {
			list[i].count += c
			continue
		}
		at[fields[0]] = len(list)
		list = append(list, ranked{fields[0], c})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("%s: no keys", path)
	}
	if counted {
		slices.SortStableFunc(list, func(a, b ranked) int { return cmp.Compare(b.count, a.count) })
	}
	out := make([]string, len(list))
	for i, k := range list {
		out[i] = k.key
	}
	return out, nil
}

// run starts the controller and waits for a signal or --duration.
func (f *memcachedFlags) run(e env, g *globals, mode mcctl.Mode, keys []string) error {
	cfg := f.cfg
	cfg.Socket, cfg.Mode, cfg.Keys = g.socketPath, mode, keys
	p, err := parsePort(f.port)
	if err != nil {
		return err
	}
	cfg.Port = p
	if f.tcpPort != "" {
		p, err := strconv.ParseUint(strings.TrimSuffix(f.tcpPort, "/tcp"), 10, 16)
		if err != nil || p == 0 {
			return fmt.Errorf("--tcp-port %q: want a number from 1 to 65535", f.tcpPort)
		}
		cfg.TCPPort = uint16(p)
	}
	if f.server != "" {
		if cfg.Server, err = netip.ParseAddrPort(f.server); err != nil {
			return fmt.Errorf("--server: %w", err)
		}
	}
	cfg.Log = controllerLog(e, f.verbose)
	cfg.Ready = func(r mcctl.Report) {
		waiting := ""
		if r.Waiting > 0 {
			waiting = fmt.Sprintf("; %d keys wait for room in santad", r.Waiting)
		}
		fmt.Fprintf(e.stdout, "ready: %d keys offloaded, %d rules on %d sockets (%d keys not offloaded%s)\n",
			r.Keys, r.Rules, r.Sockets, r.Skipped, waiting)
	}
	return runController(e, func() (*mcctl.Controller, error) { return mcctl.New(cfg) }, f.duration,
		followpkg.Options{Follow: f.follow, Socket: cfg.Socket, Port: cfg.Port, Protocol: api.ProtocolUDP, Log: cfg.Log},
		func(r mcctl.Report) string {
			var seen []string
			for _, k := range slices.Sorted(maps.Keys(r.Tracker)) {
				if r.Tracker[k] > 0 {
					seen = append(seen, fmt.Sprintf("%s=%d", k, r.Tracker[k]))
				}
			}
			return fmt.Sprintf("done: %d keys offloaded, %d rebuilt, %d removed; %d slots bumped again after writes without a reply; %d held for a delayed flush; tracker: %s",
				r.Installed, r.Refreshed, r.Removed, r.Settled, r.HeldForFlush, strings.Join(seen, " "))
		})
}
