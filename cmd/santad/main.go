// Command santad is Santa's root daemon: it attaches the rule processor to
// the configured interfaces and serves the control API. See docs/operations.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/santa-offload/santa/internal/daemon"
	"github.com/spf13/cobra"
)

const defaultConfig = "/etc/santa/santad.yaml"

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "santad:", err)
		os.Exit(1)
	}
}

// options are the command line; a flag given overrides the config file.
type options struct {
	config     string
	interfaces []string
	xdpMode    string
	socket     string
	bpffs      string
	stateDir   string
	metrics    string
	logFormat  string
	logLevel   string
}

func newRoot() *cobra.Command {
	var o options
	root := &cobra.Command{
		Use:   "santad",
		Short: "Santa's daemon: answers an application's frequent requests in XDP by its rules",
		Long: `santad loads Santa's rule processor, attaches it to the configured
interfaces and serves the control API (docs/protocol.md) on a Unix socket.
It pins its programs, maps and links under the bpffs directory, so stopping
or upgrading santad loses no rule and drops no packet: the next santad takes
over from the journal in the state directory. Needs root.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, log, err := o.load(cmd)
			if err != nil {
				return err
			}
			// from before Start: santad serves clients before Start returns,
			// and a SIGTERM meanwhile is to stop it as gracefully as later
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			// SIGHUP would end santad at once, unlogged (and systemd does not
			// restart a service a SIGHUP ended): it reloads elsewhere, and
			// santad has nothing to reload
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			go func() {
				for range hup {
					log.Warn("SIGHUP ignored: santad reloads nothing; to apply a changed config, restart it (lossless, docs/operations.md)")
				}
			}()
			d, err := daemon.Start(cfg, log)
			if err != nil {
				return err
			}
			if err := notifyReady(); err != nil {
				log.Warn("could not tell systemd that santad serves", "error", err)
			}
			return d.Wait(ctx)
		},
	}
	f := root.PersistentFlags()
	f.StringVarP(&o.config, "config", "c", "", "config file (YAML; default "+defaultConfig+" if it exists)")
	f.StringSliceVarP(&o.interfaces, "interface", "i", nil, "interface clients' requests arrive on, to attach to (repeat or comma-separate; not lo, and not one with another XDP program)")
	f.StringVar(&o.xdpMode, "xdp-mode", "", "auto, native or generic (default auto)")
	f.StringVar(&o.socket, "socket", "", "control socket path (default /run/santa/santa.sock)")
	f.StringVar(&o.bpffs, "bpffs", "", "pin directory under a bpffs (default /sys/fs/bpf/santa)")
	f.StringVar(&o.stateDir, "state-dir", "", "journal and lock directory (default /run/santa)")
	f.StringVar(&o.metrics, "metrics", "", `Prometheus listen address (default 127.0.0.1:9477; "off" disables)`)
	f.StringVar(&o.logFormat, "log-format", "", "json or text (default json)")
	f.StringVar(&o.logLevel, "log-level", "", "debug, info, warn or error (default info)")
	root.AddCommand(&cobra.Command{
		Use:   "cleanup",
		Short: "Detach the rule processor and remove all pins and state (uninstall)",
		Long: `cleanup detaches the rule processor from every interface a santad attached
it to, removes the pinned programs and maps and the journal: every rule is
gone. It also removes the control socket, the lock and the claims of
controllers that ended, and says what it removed (or that there was
nothing). Stop santad first: beside a running santad it refuses and
changes nothing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, _, err := o.load(cmd)
			if err != nil {
				return err
			}
			removed, err := daemon.Cleanup(cfg)
			for _, r := range removed {
				fmt.Fprintln(cmd.OutOrStdout(), r)
			}
			if len(removed) == 0 && err == nil {
				fmt.Fprintf(cmd.OutOrStdout(), "nothing to remove: no santad state in %s, %s or at %s\n", cfg.StateDir, cfg.BPFFS, cfg.Socket)
			}
			return err
		},
	})
	return root
}

func (o *options) load(cmd *cobra.Command) (daemon.Config, *slog.Logger, error) {
	cfg := daemon.DefaultConfig()
	path := o.config
	if path == "" {
		if _, err := os.Stat(defaultConfig); err == nil {
			path = defaultConfig
		}
	}
	if path != "" {
		var err error
		if cfg, err = daemon.LoadConfig(path); err != nil {
			return cfg, nil, err
		}
	}
	flags := cmd.Flags()
	set := func(name string, dst *string, v string) {
		if flags.Changed(name) {
			*dst = v
		}
	}
	if flags.Changed("interface") {
		cfg.Interfaces = o.interfaces
	}
	set("xdp-mode", &cfg.XDPMode, o.xdpMode)
	set("socket", &cfg.Socket, o.socket)
	set("bpffs", &cfg.BPFFS, o.bpffs)
	set("state-dir", &cfg.StateDir, o.stateDir)
	set("metrics", &cfg.Metrics, o.metrics)
	if cfg.Metrics == "off" {
		cfg.Metrics = ""
	}
	set("log-format", &cfg.LogFormat, o.logFormat)
	set("log-level", &cfg.LogLevel, o.logLevel)
	if err := cfg.Validate(); err != nil {
		return cfg, nil, err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return cfg, nil, fmt.Errorf("log_level %q: want debug, info, warn or error", cfg.LogLevel)
	}
	hopts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewJSONHandler(os.Stderr, hopts)
	if cfg.LogFormat == "text" {
		h = slog.NewTextHandler(os.Stderr, hopts)
	}
	log := slog.New(h)
	slog.SetDefault(log)
	if os.Geteuid() != 0 {
		return cfg, nil, errors.New("santad needs root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_PTRACE for attach by pid)")
	}
	return cfg, log, nil
}

// notifyReady tells systemd (Type=notify: $NOTIFY_SOCKET) that santad
// serves, so that `systemctl start santad` returns only then and a client
// run right after it finds the control socket listening.
func notifyReady() error {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil // not started by systemd
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"}) // "@...": abstract, as Go reads it
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = conn.Write([]byte("READY=1"))
	return err
}
