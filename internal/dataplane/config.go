package dataplane

import (
	"fmt"
	"time"
)

// Config sizes the rule processor's maps. The zero value of a field means its default.
type Config struct {
	// HashBits sets the bucket table to 2^HashBits entries (paper §2.2: 16–22 bits or more).
	HashBits int
	// MaxRules is the number of rules all sockets together can hold. A
	// replace, or an add that re-derives regions, holds the old and the new
	// rules of the socket at once, and freed slots are reused after a second.
	MaxRules int
	// MaxRulesets is the number of sockets that can have rules at once.
	MaxRulesets int
	// DataMiB is the memory for patterns and reply templates, in MiB pages.
	DataMiB int
	// SampleRingKiB is the size of the miss-sample ring buffer.
	SampleRingKiB int
	// TCPFlows is the number of socket-less TCP connections whose state
	// (the last request answered, where its reply stands) eBPF keeps at
	// once. A connection's first answer that finds the table full goes to
	// the kernel instead (counter tcp_pass_flows_full).
	TCPFlows int
	// TCPIdleClose is how long a socket-less keep-alive connection whose
	// replies the client has all may stay idle before the data plane
	// closes it with a FIN, as a server's keep-alive timeout would (a
	// client probing it with TCP keepalives keeps it). Zero: the default,
	// DefaultTCPIdleClose; negative: never (the connection is reset if its
	// client comes back once its stamps have expired, after 128–137 s). At
	// most MaxTCPIdleClose.
	TCPIdleClose time.Duration
	// GuardsPin is where the guard map (see Guard) is pinned, on a bpffs.
	// A map pinned there is reused, so versions outlive this data plane;
	// else the new one is pinned there. Empty: not pinned.
	GuardsPin string
	// FlowsPin is where the TCP flow table is pinned, on a bpffs, so that a
	// successor (a restarted santad) keeps the state of connections whose
	// replies are in flight: Load opens the one pinned there, CarryFlows
	// copies its flows, PublishFlows pins this data plane's own in its
	// place. Empty: not pinned.
	FlowsPin string
	// LeaveVethPeer keeps Attach from giving the other end of a veth an XDP
	// program (PeerPassName) when it has none: replies sent with XDP_TX are
	// then dropped there unless someone else attaches one.
	LeaveVethPeer bool
}

// DefaultConfig suits a server with up to 64 k rules.
var DefaultConfig = Config{
	HashBits:      20,
	MaxRules:      65536,
	MaxRulesets:   1024,
	DataMiB:       16,
	SampleRingKiB: 1024,
	TCPFlows:      int(santaSantaLimitSANTA_TCP_FLOWS),
	TCPIdleClose:  DefaultTCPIdleClose,
}

// withDefaults is c with DefaultConfig's size wherever c gives none.
func (c Config) withDefaults() Config {
	d := DefaultConfig
	for _, f := range []struct{ v, d *int }{{&c.HashBits, &d.HashBits}, {&c.MaxRules, &d.MaxRules},
		{&c.MaxRulesets, &d.MaxRulesets}, {&c.DataMiB, &d.DataMiB}, {&c.SampleRingKiB, &d.SampleRingKiB},
		{&c.TCPFlows, &d.TCPFlows}} {
		if *f.v == 0 {
			*f.v = *f.d
		}
	}
	if c.TCPIdleClose == 0 {
		c.TCPIdleClose = d.TCPIdleClose
	}
	return c
}

// Validate checks the sizes, each named by its key under santad's config
// dataplane:, before anything is loaded.
func (c Config) Validate() error {
	switch {
	case c.HashBits < 8 || c.HashBits > 28:
		return fmt.Errorf("hash_bits %d: must be between 8 and 28", c.HashBits)
	case c.MaxRules < 1 || c.MaxRules > 1<<26:
		return fmt.Errorf("max_rules %d: must be between 1 and %d", c.MaxRules, 1<<26)
	case c.MaxRulesets < 2 || c.MaxRulesets > 1<<20:
		return fmt.Errorf("max_rulesets %d: must be between 2 and %d", c.MaxRulesets, 1<<20)
	case c.DataMiB < 1 || c.DataMiB > 1<<14:
		return fmt.Errorf("data_mib %d: must be between 1 and %d", c.DataMiB, 1<<14)
	case c.SampleRingKiB < 4 || c.SampleRingKiB&(c.SampleRingKiB-1) != 0:
		return fmt.Errorf("sample_ring_kib %d: must be a power of two of at least 4", c.SampleRingKiB)
	case c.TCPFlows < 1 || c.TCPFlows > 1<<24:
		return fmt.Errorf("tcp_flows %d: must be between 1 and %d", c.TCPFlows, 1<<24)
	case c.TCPIdleClose > MaxTCPIdleClose:
		return fmt.Errorf("tcp_idle_close %v: at most %v (a connection's stamps expire after 128 s), or negative for never", c.TCPIdleClose, MaxTCPIdleClose)
	}
	return nil
}
