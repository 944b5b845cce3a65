// Package daemon is santad: it owns the loaded rule processor, serves the
// control protocol (docs/protocol.md) on a Unix socket, keeps a journal of
// every rule set so that a restart or upgrade loses nothing, and exports
// Prometheus metrics. docs/operations.md is its manual.
package daemon

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/internal/dataplane"
	"gopkg.in/yaml.v3"
)

// Config is santad's configuration file (YAML); command-line flags override it.
type Config struct {
	// Interfaces the rule processor is attached to.
	Interfaces []string `yaml:"interfaces"`
	// XDPMode is auto (native, else generic with a warning), native or generic.
	XDPMode string `yaml:"xdp_mode"`
	// VethPeerPass gives the other end of an attached veth an XDP program
	// when it has none (docs/operations.md): without one, replies are lost.
	VethPeerPass bool `yaml:"veth_peer_pass"`
	// Socket is the control socket's path.
	Socket string `yaml:"socket"`
	// SocketMode is its permission bits, as an octal string ("0666").
	SocketMode string `yaml:"socket_mode"`
	// SocketGroup, if set, owns the control socket.
	SocketGroup string `yaml:"socket_group"`
	// BPFFS is the directory under a bpffs where programs, maps and links are pinned.
	BPFFS string `yaml:"bpffs"`
	// StateDir holds the rule journal and the lock; keep it across restarts (tmpfs is right: rules die with their sockets at reboot).
	StateDir string `yaml:"state_dir"`
	// Cgroup is the cgroup v2 directory whose sockets' release is watched; empty finds the root.
	Cgroup string `yaml:"cgroup"`
	// Metrics is the Prometheus listen address; empty turns metrics off.
	Metrics string `yaml:"metrics"`
	// MetricsRuleLimit caps per-rule series: with more rules, only per-socket totals are exported.
	MetricsRuleLimit int `yaml:"metrics_rule_limit"`
	// LogFormat is json or text.
	LogFormat string `yaml:"log_format"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"log_level"`
	// UserPorts, if set, are the only ports ("53/udp", "8000-8099/tcp") on
	// which a non-root uid may bind a socket: the rule processor answers
	// before the host's firewall sees a request (docs/operations.md).
	UserPorts []string `yaml:"user_ports"`
	// Quota applies to every non-root uid.
	Quota Quota `yaml:"quota"`
	// Dataplane sizes the rule processor's maps.
	Dataplane DataplaneConfig `yaml:"dataplane"`
}

// Quota bounds what one uid may install; zero means unlimited.
type Quota struct {
	// Rules and TemplateBytes bound a uid's share of dataplane.max_rules
	// and data_mib (a sixteenth of the defaults): above them, one user
	// could fill the data plane and leave no room to root or the others.
	Rules         uint64 `yaml:"rules"`
	TemplateBytes uint64 `yaml:"template_bytes"` // patterns, masks and reply templates
	// Rulesets bounds the sockets a uid binds: without it one user could
	// take all of dataplane.max_rulesets, root's binds included.
	Rulesets uint64 `yaml:"rulesets"`
	// Connections bounds the control connections a uid holds open at once:
	// each costs santad an fd, and without it one user's idle connections
	// could take all of santad's fds and shut everyone else out.
	Connections uint64 `yaml:"connections"`
	// RequestBytes bounds the memory a uid's requests hold in santad at
	// once, frames and what decoding them allocates (requestBudget).
	RequestBytes uint64 `yaml:"request_bytes"`
}

// DataplaneConfig mirrors dataplane.Config in the file.
type DataplaneConfig struct {
	HashBits      int `yaml:"hash_bits"`
	MaxRules      int `yaml:"max_rules"`
	MaxRulesets   int `yaml:"max_rulesets"`
	DataMiB       int `yaml:"data_mib"`
	SampleRingKiB int `yaml:"sample_ring_kib"`
	TCPFlows      int `yaml:"tcp_flows"`
	// TCPIdleClose is how long a socket-less keep-alive connection may be
	// idle before eBPF's FIN closes it; 0: never.
	TCPIdleClose time.Duration `yaml:"tcp_idle_close"`
}

// DefaultConfig is what santad runs with when neither file nor flags say otherwise.
func DefaultConfig() Config {
	d := dataplane.DefaultConfig
	return Config{
		XDPMode:          "auto",
		VethPeerPass:     true,
		Socket:           api.DefaultSocket,
		SocketMode:       "0666",
		BPFFS:            "/sys/fs/bpf/santa",
		StateDir:         "/run/santa",
		Metrics:          "127.0.0.1:9477",
		MetricsRuleLimit: 10000,
		LogFormat:        "json",
		LogLevel:         "info",
		Quota:            Quota{Rules: 4096, TemplateBytes: 1 << 20, Rulesets: 64, Connections: 256, RequestBytes: 1 << 30},
		Dataplane: DataplaneConfig{HashBits: d.HashBits, MaxRules: d.MaxRules, MaxRulesets: d.MaxRulesets,
			DataMiB: d.DataMiB, SampleRingKiB: d.SampleRingKiB, TCPFlows: d.TCPFlows, TCPIdleClose: d.TCPIdleClose},
	}
}

// LoadConfig reads a YAML file over the defaults; unknown keys are errors.
func LoadConfig(path string) (Config, error) {
	c := DefaultConfig()
	f, err := os.Open(path)
	if err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	// an empty file stands for the defaults
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return c, fmt.Errorf("config %s: %s", path, configPlaces.Replace(err.Error()))
	}
	return c, nil
}

// configPlaces names the places of the config file where the YAML decoder
// names this package's Go types ("field rulez not found in type
// daemon.Quota"), with the keys each takes.
var configPlaces = strings.NewReplacer(
	"type daemon.Config", "the file "+yamlKeys(Config{}),
	"type daemon.Quota", "quota "+yamlKeys(Quota{}),
	"type daemon.DataplaneConfig", "dataplane "+yamlKeys(DataplaneConfig{}),
)

// yamlKeys lists the YAML keys of struct v's fields: "(keys: a, b)".
func yamlKeys(v any) string {
	t := reflect.TypeOf(v)
	keys := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		keys = append(keys, strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0])
	}
	return "(keys: " + strings.Join(keys, ", ") + ")"
}

// Validate checks the configuration before anything is loaded.
func (c Config) Validate() error {
	switch c.XDPMode {
	case "auto", "native", "generic":
	default:
		return fmt.Errorf("xdp_mode %q: want auto, native or generic", c.XDPMode)
	}
	if _, err := c.socketMode(); err != nil {
		return err
	}
	switch c.LogFormat {
	case "json", "text":
	default:
		return fmt.Errorf("log_format %q: want json or text", c.LogFormat)
	}
	if c.Socket == "" || c.BPFFS == "" || c.StateDir == "" {
		return errors.New("socket, bpffs and state_dir must not be empty")
	}
	// an interface takes one rule processor: santad would attach twice, and
	// list and follow it twice
	for i, name := range c.Interfaces {
		if slices.Contains(c.Interfaces[:i], name) {
			return fmt.Errorf("interface %s is given twice (interfaces: %v)", name, c.Interfaces)
		}
	}
	if c.MetricsRuleLimit < 0 {
		return fmt.Errorf("metrics_rule_limit %d: must be 0 (no per-rule series) or more", c.MetricsRuleLimit)
	}
	// a size of 0 has no meaning (the data plane would take its default
	// for it, not what was written)
	d, def := c.Dataplane, DefaultConfig().Dataplane
	for _, f := range []struct {
		key    string
		v, def int
	}{{"hash_bits", d.HashBits, def.HashBits}, {"max_rules", d.MaxRules, def.MaxRules},
		{"max_rulesets", d.MaxRulesets, def.MaxRulesets}, {"data_mib", d.DataMiB, def.DataMiB},
		{"sample_ring_kib", d.SampleRingKiB, def.SampleRingKiB}, {"tcp_flows", d.TCPFlows, def.TCPFlows}} {
		if f.v <= 0 {
			return fmt.Errorf("dataplane.%s %d: must be more than 0 (leave it out for the default, %d)", f.key, f.v, f.def)
		}
	}
	if d.TCPIdleClose > 0 && d.TCPIdleClose < time.Second {
		return fmt.Errorf("dataplane.tcp_idle_close %v: give a duration with its unit, e.g. 75s", d.TCPIdleClose)
	}
	if d.TCPIdleClose < 0 || d.TCPIdleClose > dataplane.MaxTCPIdleClose {
		return fmt.Errorf("dataplane.tcp_idle_close %v: must be between 0 (never) and %v (a connection's stamps expire after 128 s)",
			d.TCPIdleClose, dataplane.MaxTCPIdleClose)
	}
	// the data plane's ranges, here so that a mistake leaves nothing behind
	if err := c.dataplaneConfig().Validate(); err != nil {
		return fmt.Errorf("dataplane.%w", err)
	}
	_, err := c.userPorts()
	return err
}

// portRange is ports lo to hi of one transport (api.ProtocolUDP or TCP).
type portRange struct {
	lo, hi   uint16
	protocol uint32
}

func (r portRange) holds(port uint16, protocol uint32) bool {
	return r.protocol == protocol && r.lo <= port && port <= r.hi
}

// userPorts parses user_ports: each "PORT/udp", "PORT/tcp" or "LOW-HIGH/udp".
func (c Config) userPorts() ([]portRange, error) {
	ranges := make([]portRange, 0, len(c.UserPorts))
	for _, s := range c.UserPorts {
		bad := fmt.Errorf("user_ports %q: want PORT/udp, PORT/tcp or a range LOW-HIGH/udp (ports 1 to 65535)", s)
		ports, proto, _ := strings.Cut(s, "/")
		r := portRange{protocol: map[string]uint32{"udp": api.ProtocolUDP, "tcp": api.ProtocolTCP}[proto]}
		loText, hiText, isRange := strings.Cut(ports, "-")
		if !isRange {
			hiText = loText
		}
		lo, errLo := strconv.ParseUint(loText, 10, 16)
		hi, errHi := strconv.ParseUint(hiText, 10, 16)
		if r.protocol == 0 || errLo != nil || errHi != nil || lo == 0 || hi < lo {
			return nil, bad
		}
		r.lo, r.hi = uint16(lo), uint16(hi)
		ranges = append(ranges, r)
	}
	return ranges, nil
}

func (c Config) socketMode() (os.FileMode, error) {
	m, err := strconv.ParseUint(c.SocketMode, 8, 32)
	if err != nil || m > 0o777 {
		return 0, fmt.Errorf("socket_mode %q: want octal permission bits like 0666", c.SocketMode)
	}
	return os.FileMode(m), nil
}

func (c Config) xdpMode() dataplane.AttachMode {
	switch c.XDPMode {
	case "native":
		return dataplane.AttachNative
	case "generic":
		return dataplane.AttachGeneric
	}
	return dataplane.AttachAuto
}

func (c Config) dataplaneConfig() dataplane.Config {
	d := c.Dataplane
	idleClose := d.TCPIdleClose
	if idleClose == 0 {
		idleClose = -1 // never: the data plane reads 0 as its default
	}
	return dataplane.Config{HashBits: d.HashBits, MaxRules: d.MaxRules, MaxRulesets: d.MaxRulesets,
		DataMiB: d.DataMiB, SampleRingKiB: d.SampleRingKiB, TCPFlows: d.TCPFlows, TCPIdleClose: idleClose,
		GuardsPin: c.GuardsPin(), FlowsPin: filepath.Join(c.BPFFS, "tcp_flows"), LeaveVethPeer: !c.VethPeerPass}
}

// GuardsPin is where the guard map is pinned: apart from the generations,
// since write trackers and controllers hold on to it across restarts.
func (c Config) GuardsPin() string { return filepath.Join(c.BPFFS, "guards") }
