// Package api is Santa's control protocol: the messages santad and its clients
// exchange over santad's Unix socket, and their framing. docs/protocol.md is
// the specification; testdata/protocol/vectors.json holds the byte-exact
// examples every client library is tested against.
package api

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Version is the protocol version this package speaks.
const Version = 1

// DefaultSocket is where santad listens unless told otherwise.
const DefaultSocket = "/run/santa/santa.sock"

// ClaimsDir is where the controllers of the santad listening at socket
// claim their tags (integrations/follow.ClaimTag): beside the socket,
// writable by every user (sticky, as /tmp), since any user may run a
// controller for a server of theirs.
func ClaimsDir(socket string) string { return filepath.Join(filepath.Dir(socket), "controllers") }

// MakeClaimsDir makes ClaimsDir(socket) if it is not there: santad when it
// starts, else the first controller. The socket's directory must exist (a
// controller given a mistyped socket path must not make it).
func MakeClaimsDir(socket string) error {
	dir := ClaimsDir(socket)
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.Mkdir(dir, 0o755); errors.Is(err, fs.ErrExist) {
		return nil // made meanwhile, by santad or another controller
	} else if err != nil {
		return err
	}
	return os.Chmod(dir, os.ModeSticky|0o777)
}

// MaxFrame is the largest message either side accepts, in bytes.
const MaxFrame = 256 << 20

// Op says what a request asks for, or that a message is an event.
type Op uint

const (
	OpHealth      Op = 1  // daemon state, the caller's quota, global counters
	OpBind        Op = 2  // give a socket a rule set (idempotent)
	OpUnbind      Op = 3  // remove a socket's rule set and all its rules
	OpAdd         Op = 4  // add rules, all or none
	OpReplace     Op = 5  // swap all of a socket's rules, atomically
	OpModify      Op = 6  // change rules in place, keeping their ids
	OpDelete      Op = 7  // delete rules, all or none
	OpListSockets Op = 8  // the rule sets the caller may see
	OpListRules   Op = 9  // one socket's rules
	OpStats       Op = 10 // per-rule statistics
	OpSubscribe   Op = 11 // stream miss samples of a socket on this connection
	OpSample      Op = 12 // event: one miss sample (daemon to client)
)

var opNames = map[Op]string{
	OpHealth: "health", OpBind: "bind", OpUnbind: "unbind", OpAdd: "add", OpReplace: "replace",
	OpModify: "modify", OpDelete: "delete", OpListSockets: "list_sockets", OpListRules: "list_rules",
	OpStats: "stats", OpSubscribe: "subscribe", OpSample: "sample",
}

// Known says whether o is an op of this protocol version.
func (o Op) Known() bool {
	_, ok := opNames[o]
	return ok
}

func (o Op) String() string {
	if n, ok := opNames[o]; ok {
		return n
	}
	return "op" + itoa(uint64(o))
}

// Status is a response's outcome; every non-zero status comes with an error text.
type Status uint

const (
	StatusOK          Status = 0
	StatusMalformed   Status = 1 // the message is not a valid frame or CBOR map of this protocol
	StatusInvalid     Status = 2 // a field's value is refused (e.g. an invalid rule)
	StatusPermission  Status = 3 // the caller may not do this
	StatusNotFound    Status = 4 // no such socket or rule
	StatusQuota       Status = 5 // the caller's uid would exceed its quota
	StatusFull        Status = 6 // the data plane has no room left
	StatusVersion     Status = 7 // unsupported protocol version
	StatusInternal    Status = 8 // santad failed; see its log
	StatusUnsupported Status = 9 // unknown op
)

var statusNames = map[Status]string{
	StatusOK: "ok", StatusMalformed: "malformed", StatusInvalid: "invalid", StatusPermission: "permission denied",
	StatusNotFound: "not found", StatusQuota: "quota exceeded", StatusFull: "full", StatusVersion: "version",
	StatusInternal: "internal", StatusUnsupported: "unsupported",
}

func (s Status) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return "status" + itoa(uint64(s))
}

func itoa(v uint64) string {
	if v == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for ; v > 0; v /= 10 {
		i--
		b[i] = byte('0' + v%10)
	}
	return string(b[i:])
}

// Message is every request, response and event: one CBOR map with small
// integer keys from one key space. A key whose value is zero, empty or false
// is left out, and a missing key reads as zero.
type Message struct {
	V           uint              `cbor:"0,keyasint,omitempty" json:"v,omitempty"`
	Op          Op                `cbor:"1,keyasint,omitempty" json:"op,omitempty"`
	Seq         uint64            `cbor:"2,keyasint,omitempty" json:"seq,omitempty"`
	Status      Status            `cbor:"3,keyasint,omitempty" json:"status,omitempty"`
	Error       string            `cbor:"4,keyasint,omitempty" json:"error,omitempty"`
	Socket      uint64            `cbor:"5,keyasint,omitempty" json:"socket,omitempty"` // socket cookie
	PID         uint32            `cbor:"6,keyasint,omitempty" json:"pid,omitempty"`    // root: a process to take a socket from
	FD          uint32            `cbor:"7,keyasint,omitempty" json:"fd,omitempty"`     // root: that process's fd number
	Port        uint16            `cbor:"8,keyasint,omitempty" json:"port,omitempty"`   // root: take the sockets bound to this port
	Rules       []Rule            `cbor:"9,keyasint,omitempty" json:"rules,omitempty"`
	IDs         []uint64          `cbor:"10,keyasint,omitempty" json:"ids,omitempty"`
	Sockets     []SocketInfo      `cbor:"11,keyasint,omitempty" json:"sockets,omitempty"`
	Stats       []RuleStats       `cbor:"12,keyasint,omitempty" json:"stats,omitempty"`
	SampleBytes uint32            `cbor:"13,keyasint,omitempty" json:"sample_bytes,omitempty"`
	SampleRate  uint32            `cbor:"14,keyasint,omitempty" json:"sample_rate,omitempty"`
	Sample      Bytes             `cbor:"15,keyasint,omitempty" json:"sample,omitempty"`
	Daemon      *DaemonInfo       `cbor:"16,keyasint,omitempty" json:"daemon,omitempty"`
	Counters    map[string]uint64 `cbor:"17,keyasint,omitempty" json:"counters,omitempty"`
	RequestLen  uint32            `cbor:"18,keyasint,omitempty" json:"request_len,omitempty"`
	Protocol    uint32            `cbor:"19,keyasint,omitempty" json:"protocol,omitempty"` // bind by port: ProtocolUDP (also 0) or ProtocolTCP
	After       uint64            `cbor:"20,keyasint,omitempty" json:"after,omitempty"`    // list_rules: only rules with a larger id (the last id of the page before)
	Limit       uint32            `cbor:"21,keyasint,omitempty" json:"limit,omitempty"`    // list_rules: at most this many rules (0: all)
	More        bool              `cbor:"22,keyasint,omitempty" json:"more,omitempty"`     // list_rules response: rules past the last listed one remain
	Tag         string            `cbor:"23,keyasint,omitempty" json:"tag,omitempty"`      // list_rules: only rules with this tag; delete: every rule with it
}

// IP protocol numbers: of a bound socket (SocketInfo.Protocol), and of the
// sockets a bind by port takes (Message.Protocol; 0 is UDP).
const (
	ProtocolTCP = 6  // TCP: listening sockets
	ProtocolUDP = 17 // UDP: unconnected sockets
)

// Rule is a rule as the protocol carries it; see dataplane.Rule for its meaning.
type Rule struct {
	ID         uint64      `cbor:"0,keyasint,omitempty" json:"id,omitempty"`      // in responses and modify
	Version    uint32      `cbor:"1,keyasint,omitempty" json:"version,omitempty"` // in responses
	Conditions []Condition `cbor:"2,keyasint,omitempty" json:"conditions,omitempty"`
	Processors []Processor `cbor:"3,keyasint,omitempty" json:"processors,omitempty"`
	ReplyLen   uint32      `cbor:"4,keyasint,omitempty" json:"reply_len,omitempty"`
	Priority   uint32      `cbor:"5,keyasint,omitempty" json:"priority,omitempty"`
	MinLen     uint32      `cbor:"6,keyasint,omitempty" json:"min_len,omitempty"`  // shortest request payload answered, 0 = no bound
	MaxLen     uint32      `cbor:"7,keyasint,omitempty" json:"max_len,omitempty"`  // longest request payload answered, 0 = no bound
	Guards     []Guard     `cbor:"8,keyasint,omitempty" json:"guards,omitempty"`   // the rule answers only while these hold
	Close      bool        `cbor:"9,keyasint,omitempty" json:"close,omitempty"`    // TCP only: the reply ends the connection (sent with FIN)
	Expires    uint64      `cbor:"10,keyasint,omitempty" json:"expires,omitempty"` // Unix time (s) santad removes the rule at, 0 = never
	Tag        string      `cbor:"11,keyasint,omitempty" json:"tag,omitempty"`     // who added the rule, e.g. "santa-dns": how a restarted controller finds its predecessor's rules
}

// MaxTagLen is the longest Tag santad accepts, in bytes.
const MaxTagLen = 64

// CheckTag says why santad would refuse tag: longer than MaxTagLen bytes,
// not UTF-8, or holding a control character (it is printed in listings).
func CheckTag(tag string) error {
	if len(tag) > MaxTagLen {
		return fmt.Errorf("tag %.20q… is %d bytes, at most %d", tag, len(tag), MaxTagLen)
	}
	if !utf8.ValidString(tag) {
		return fmt.Errorf("tag %q is not UTF-8", tag)
	}
	if i := strings.IndexFunc(tag, unicode.IsControl); i >= 0 {
		return fmt.Errorf("tag %q has a control character at byte %d", tag, i)
	}
	return nil
}

// MatchKey names what r matches: its length bounds and conditions. Rules
// with equal keys answer the same requests, so a controller uses it to find
// the rule of a request it is about to install among those it inherited.
func (r Rule) MatchKey() string {
	var k strings.Builder
	fmt.Fprintf(&k, "%d-%d", r.MinLen, r.MaxLen)
	for _, c := range r.Conditions {
		fmt.Fprintf(&k, "|%d:%x/%x", c.Offset, []byte(c.Pattern), []byte(c.Mask))
	}
	return k.String()
}

// Guard holds while slot Slot of santad's guard map holds Version (see
// dataplane.Guard): how a write tracker retires rules whose answer changed.
type Guard struct {
	Slot    uint32 `cbor:"0,keyasint,omitempty" json:"slot,omitempty"`
	Version uint64 `cbor:"1,keyasint,omitempty" json:"version,omitempty"`
}

// Condition holds when the request payload carries Pattern at Offset, in the
// bits set in Mask if it has one (one byte per pattern byte).
type Condition struct {
	Offset  uint32 `cbor:"0,keyasint,omitempty" json:"offset,omitempty"`
	Pattern Bytes  `cbor:"1,keyasint,omitempty" json:"pattern,omitempty"`
	Mask    Bytes  `cbor:"2,keyasint,omitempty" json:"mask,omitempty"`
}

// Processor kinds.
const (
	KindPut  = 1 // write Template at ReplyOffset
	KindCopy = 2 // copy Length request bytes from SrcOffset to ReplyOffset
)

// Processor writes part of the reply.
type Processor struct {
	Kind        uint32 `cbor:"0,keyasint,omitempty" json:"kind,omitempty"`
	ReplyOffset uint32 `cbor:"1,keyasint,omitempty" json:"reply_offset,omitempty"`
	Template    Bytes  `cbor:"2,keyasint,omitempty" json:"template,omitempty"`
	SrcOffset   uint32 `cbor:"3,keyasint,omitempty" json:"src_offset,omitempty"`
	Length      uint32 `cbor:"4,keyasint,omitempty" json:"length,omitempty"`
	Mask        Bytes  `cbor:"5,keyasint,omitempty" json:"mask,omitempty"` // copy: only these bits, one byte per copied byte
}

// SocketInfo describes a socket that has a rule set.
type SocketInfo struct {
	Cookie        uint64 `cbor:"0,keyasint,omitempty" json:"cookie,omitempty"`
	Family        uint32 `cbor:"1,keyasint,omitempty" json:"family,omitempty"`   // 4 or 6
	Protocol      uint32 `cbor:"2,keyasint,omitempty" json:"protocol,omitempty"` // IP protocol number: 17 UDP, 6 TCP (a listening socket)
	Address       Bytes  `cbor:"3,keyasint,omitempty" json:"address,omitempty"`  // bound address, 4 or 16 bytes
	Port          uint16 `cbor:"4,keyasint,omitempty" json:"port,omitempty"`
	Owner         uint32 `cbor:"5,keyasint,omitempty" json:"owner,omitempty"` // uid
	Rules         uint64 `cbor:"6,keyasint,omitempty" json:"rules,omitempty"`
	TemplateBytes uint64 `cbor:"7,keyasint,omitempty" json:"template_bytes,omitempty"`
	Hits          uint64 `cbor:"8,keyasint,omitempty" json:"hits,omitempty"`
	Created       bool   `cbor:"9,keyasint,omitempty" json:"created,omitempty"`      // bind: the rule set is new
	PID           uint32 `cbor:"10,keyasint,omitempty" json:"pid,omitempty"`         // process that bound it, if known
	ReplyBytes    uint64 `cbor:"11,keyasint,omitempty" json:"reply_bytes,omitempty"` // reply frame bytes its rules sent, as Hits
}

// RuleStats counts what one rule answered.
type RuleStats struct {
	ID    uint64 `cbor:"0,keyasint,omitempty" json:"id,omitempty"`
	Hits  uint64 `cbor:"1,keyasint,omitempty" json:"hits,omitempty"`
	Bytes uint64 `cbor:"2,keyasint,omitempty" json:"bytes,omitempty"` // reply frame bytes sent
}

// DaemonInfo is santad's answer to health.
type DaemonInfo struct {
	Version       string      `cbor:"0,keyasint,omitempty" json:"version,omitempty"`
	Protocol      uint32      `cbor:"1,keyasint,omitempty" json:"protocol,omitempty"`
	PID           uint32      `cbor:"2,keyasint,omitempty" json:"pid,omitempty"`
	UptimeSeconds uint64      `cbor:"3,keyasint,omitempty" json:"uptime_seconds,omitempty"`
	Interfaces    []Interface `cbor:"4,keyasint,omitempty" json:"interfaces,omitempty"`
	Sockets       uint64      `cbor:"5,keyasint,omitempty" json:"sockets,omitempty"`
	Rules         uint64      `cbor:"6,keyasint,omitempty" json:"rules,omitempty"`
	MaxRules      uint64      `cbor:"7,keyasint,omitempty" json:"max_rules,omitempty"`
	DataBytes     uint64      `cbor:"8,keyasint,omitempty" json:"data_bytes,omitempty"`
	MaxDataBytes  uint64      `cbor:"9,keyasint,omitempty" json:"max_data_bytes,omitempty"`
	UID           uint32      `cbor:"10,keyasint,omitempty" json:"uid,omitempty"` // the caller, as santad sees it
	QuotaRules    uint64      `cbor:"11,keyasint,omitempty" json:"quota_rules,omitempty"`
	QuotaBytes    uint64      `cbor:"12,keyasint,omitempty" json:"quota_bytes,omitempty"`
	UsedRules     uint64      `cbor:"13,keyasint,omitempty" json:"used_rules,omitempty"`
	UsedBytes     uint64      `cbor:"14,keyasint,omitempty" json:"used_bytes,omitempty"`
	QuotaRulesets uint64      `cbor:"15,keyasint,omitempty" json:"quota_rulesets,omitempty"`
	UsedRulesets  uint64      `cbor:"16,keyasint,omitempty" json:"used_rulesets,omitempty"`
}

// Interface is an interface the rule processor is attached to.
type Interface struct {
	Name string `cbor:"0,keyasint,omitempty" json:"name,omitempty"`
	Mode string `cbor:"1,keyasint,omitempty" json:"mode,omitempty"` // "native", "generic" or "removed" (until an interface of that name is back)
	// Peer, for a veth in native mode, is the XDP program its other end has
	// (replies sent from XDP arrive only if it has one in native mode), e.g.
	// "cv0: XDP program 12 (santa_peer_pass)" or "cv0: no XDP program:
	// replies sent from XDP are dropped"; empty for other interfaces.
	Peer string `cbor:"2,keyasint,omitempty" json:"peer,omitempty"`
}

// AddrPort is the socket's bound address and port (the zero AddrPort if the
// address is not 4 or 16 bytes).
func (s SocketInfo) AddrPort() netip.AddrPort {
	a, ok := netip.AddrFromSlice(s.Address)
	if !ok {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(a, s.Port)
}

// LoopbackWarning is what clients say when every socket they attached to is
// bound to a loopback address (LoopbackOnly).
const LoopbackWarning = "every socket attached to is bound to a loopback address: only clients on this host reach it, over lo, " +
	"where the rule processor does not answer; bind the server to the addresses its clients use (docs/operations.md)"

// LoopbackOnly says whether socks are all bound to loopback addresses, so
// that rules on them never answer: their requests travel over lo, which
// santad does not attach to.
func LoopbackOnly(socks []SocketInfo) bool {
	for _, s := range socks {
		if !s.AddrPort().Addr().Unmap().IsLoopback() {
			return false
		}
	}
	return len(socks) > 0
}
