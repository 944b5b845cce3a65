package api

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"reflect"
	"testing"

	"github.com/fxamacker/cbor/v2"
)

var update = flag.Bool("update", false, "rewrite testdata/protocol/vectors.json from the messages below")

const vectorsPath = "../testdata/protocol/vectors.json"

// Vector is one shared test vector: a message, whether a socket fd travels
// with it, and its exact CBOR encoding.
type Vector struct {
	Name    string  `json:"name"`
	PassFD  bool    `json:"pass_fd,omitempty"`
	Message Message `json:"message"`
	CBOR    string  `json:"cbor"`
}

// vectorMessages covers every op, every key and the integer widths.
var vectorMessages = []Vector{
	{Name: "health request", Message: Message{V: 1, Op: OpHealth, Seq: 1}},
	{Name: "health response", Message: Message{V: 1, Op: OpHealth, Seq: 1,
		Daemon: &DaemonInfo{Version: "0.3.0", Protocol: 1, PID: 4242, UptimeSeconds: 3600,
			Interfaces: []Interface{{Name: "veth0", Mode: "native", Peer: "veth1: XDP program 12 (santa_peer_pass)"}}, Sockets: 2, Rules: 1000,
			MaxRules: 65536, DataBytes: 24576, MaxDataBytes: 16 << 20, UID: 65534,
			QuotaRules: 100000, QuotaBytes: 64 << 20, UsedRules: 1000, UsedBytes: 24576, QuotaRulesets: 64, UsedRulesets: 2},
		Counters: map[string]uint64{"answered": 123456789, "pass_no_match": 42, "pass_not_udp": 0}}},
	{Name: "bind the passed socket, with miss samples", PassFD: true,
		Message: Message{V: 1, Op: OpBind, Seq: 2, SampleBytes: 64, SampleRate: 100}},
	{Name: "bind a socket of another process (root)", Message: Message{V: 1, Op: OpBind, Seq: 3, PID: 1234, FD: 5}},
	{Name: "bind the sockets on a port (root)", Message: Message{V: 1, Op: OpBind, Seq: 4, Port: 53}},
	{Name: "bind response", Message: Message{V: 1, Op: OpBind, Seq: 2, Sockets: []SocketInfo{{
		Cookie: 4097, Family: 4, Protocol: 17, Address: Bytes{198, 18, 0, 1}, Port: 5353,
		Owner: 65534, Created: true, PID: 1234}}}},
	{Name: "add the paper's Listing 1 rule to the passed socket", PassFD: true,
		Message: Message{V: 1, Op: OpAdd, Seq: 5, Rules: []Rule{{
			Conditions: []Condition{{Offset: 0, Pattern: Bytes("Hello")}},
			Processors: []Processor{{Kind: KindPut, ReplyOffset: 0, Template: Bytes("COMSYS")}},
			ReplyLen:   6}}}},
	{Name: "add a DNS-style rule by cookie", Message: Message{V: 1, Op: OpAdd, Seq: 6, Socket: 1<<40 + 7, Rules: []Rule{{
		Conditions: []Condition{{Offset: 2, Pattern: Bytes{1, 0, 0, 1}}, {Offset: 12, Pattern: Bytes("\x03www\x07example\x03com\x00")}},
		Processors: []Processor{
			{Kind: KindPut, ReplyOffset: 2, Template: Bytes{0x81, 0x80, 0, 1, 0, 1}},
			{Kind: KindCopy, ReplyOffset: 0, SrcOffset: 0, Length: 2}},
		ReplyLen: 300, Priority: 10}}}},
	{Name: "add a rule with masked condition and copy and request length bounds", Message: Message{V: 1, Op: OpAdd, Seq: 15, Socket: 4097, Rules: []Rule{{
		Conditions: []Condition{
			{Offset: 2, Pattern: Bytes{0x00, 0x00}, Mask: Bytes{0x78, 0x4f}},
			{Offset: 4, Pattern: Bytes{0, 1, 0, 0, 0, 0, 0, 0, 3, 'w', 'w', 'w', 0, 0, 1, 0, 1}}},
		Processors: []Processor{
			{Kind: KindCopy, ReplyOffset: 0, SrcOffset: 0, Length: 2},
			{Kind: KindPut, ReplyOffset: 2, Template: Bytes{0x84, 0x00, 0, 1, 0, 1}},
			{Kind: KindCopy, ReplyOffset: 2, SrcOffset: 2, Length: 2, Mask: Bytes{0x01, 0x10}}},
		ReplyLen: 40, MinLen: 21, MaxLen: 300}}}},
	{Name: "add a memcached-style rule with guards", Message: Message{V: 1, Op: OpAdd, Seq: 16, Socket: 4097, Rules: []Rule{{
		Conditions: []Condition{{Offset: 4, Pattern: Bytes{0, 1, 0, 0}}, {Offset: 8, Pattern: Bytes("get k1\r\n")}},
		Processors: []Processor{
			{Kind: KindCopy, ReplyOffset: 0, SrcOffset: 0, Length: 2},
			{Kind: KindPut, ReplyOffset: 2, Template: Bytes("\x00\x00\x00\x01\x00\x00VALUE k1 0 2\r\nv1\r\nEND\r\n")}},
		ReplyLen: 31, MaxLen: 16,
		Guards: []Guard{{Slot: 7, Version: 3}, {Slot: 1<<20 - 1, Version: 1<<32 + 1}}}}}},
	{Name: "add response", Message: Message{V: 1, Op: OpAdd, Seq: 6, IDs: []uint64{1, 2, 255, 256, 65536, 1 << 32}}},
	{Name: "replace all rules", Message: Message{V: 1, Op: OpReplace, Seq: 7, Socket: 4097, Rules: []Rule{{
		Conditions: []Condition{{Offset: 0, Pattern: Bytes("ping")}},
		Processors: []Processor{{Kind: KindPut, Template: Bytes("pong")}},
		ReplyLen:   4}}}},
	{Name: "modify a rule", Message: Message{V: 1, Op: OpModify, Seq: 8, Socket: 4097, Rules: []Rule{{ID: 3,
		Conditions: []Condition{{Offset: 0, Pattern: Bytes("Hello")}},
		Processors: []Processor{{Kind: KindPut, Template: Bytes("COM")}},
		ReplyLen:   3}}}},
	// no id: a client sends it as it is, and santad refuses it (invalid)
	{Name: "modify a rule without an id", Message: Message{V: 1, Op: OpModify, Seq: 8, Socket: 4097, Rules: []Rule{{
		Conditions: []Condition{{Offset: 0, Pattern: Bytes("Hello")}},
		Processors: []Processor{{Kind: KindPut, Template: Bytes("COM")}},
		ReplyLen:   3}}}},
	{Name: "delete rules", Message: Message{V: 1, Op: OpDelete, Seq: 9, Socket: 4097, IDs: []uint64{3, 4}}},
	{Name: "unbind", Message: Message{V: 1, Op: OpUnbind, Seq: 10, Socket: 4097}},
	{Name: "list sockets", Message: Message{V: 1, Op: OpListSockets, Seq: 11}},
	{Name: "list sockets response", Message: Message{V: 1, Op: OpListSockets, Seq: 11, Sockets: []SocketInfo{
		{Cookie: 4097, Family: 4, Protocol: 17, Address: Bytes{0, 0, 0, 0}, Port: 5353, Owner: 65534, Rules: 2, TemplateBytes: 9, Hits: 77, ReplyBytes: 1 << 33},
		{Cookie: 8193, Family: 6, Protocol: 17, Address: Bytes{0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, Port: 65535}}}},
	{Name: "list rules", Message: Message{V: 1, Op: OpListRules, Seq: 12, Socket: 4097}},
	{Name: "list rules response", Message: Message{V: 1, Op: OpListRules, Seq: 12, Rules: []Rule{{ID: 3, Version: 2,
		Conditions: []Condition{{Offset: 0, Pattern: Bytes("Hello")}},
		Processors: []Processor{{Kind: KindPut, Template: Bytes("COMSYS")}},
		ReplyLen:   6}}}},
	{Name: "list rules response with a guard", Message: Message{V: 1, Op: OpListRules, Seq: 17, Rules: []Rule{{ID: 9, Version: 1,
		Conditions: []Condition{{Offset: 0, Pattern: Bytes("ping")}},
		Processors: []Processor{{Kind: KindPut, Template: Bytes("pong")}},
		ReplyLen:   4, Guards: []Guard{{Slot: 0, Version: 300}}}}}},
	{Name: "stats of some rules", Message: Message{V: 1, Op: OpStats, Seq: 13, Socket: 4097, IDs: []uint64{3}}},
	{Name: "stats response", Message: Message{V: 1, Op: OpStats, Seq: 13, Stats: []RuleStats{{ID: 3, Hits: 1 << 33, Bytes: 1 << 40}, {ID: 4}}}},
	{Name: "subscribe to miss samples", Message: Message{V: 1, Op: OpSubscribe, Seq: 14, Socket: 4097, SampleBytes: 128, SampleRate: 1000}},
	{Name: "miss sample event", Message: Message{V: 1, Op: OpSample, Seq: 14, Socket: 4097, RequestLen: 29, Sample: Bytes("\x12\x34\x01\x00\x00\x01")}},
	{Name: "error response", Message: Message{V: 1, Op: OpAdd, Seq: 5, Status: StatusInvalid,
		Error: "rule 0: invalid rule: reply length 0: must be between 1 and 1472"}},
	{Name: "bind the TCP listeners on a port (root)", Message: Message{V: 1, Op: OpBind, Seq: 18, Port: 80, Protocol: ProtocolTCP}},
	{Name: "bind response for a TCP listener", Message: Message{V: 1, Op: OpBind, Seq: 18, Sockets: []SocketInfo{{
		Cookie: 12289, Family: 6, Protocol: ProtocolTCP, Address: Bytes(make([]byte, 16)), Port: 80,
		Created: true, PID: 4321}}}},
	{Name: "add a TCP rule whose reply closes the connection", Message: Message{V: 1, Op: OpAdd, Seq: 19, Socket: 12289, Rules: []Rule{{
		Conditions: []Condition{{Offset: 0, Pattern: Bytes("GET /health HTTP/1.1\r\n")}},
		Processors: []Processor{{Kind: KindPut, Template: Bytes("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")}},
		ReplyLen:   59, Close: true}}}},
	{Name: "add a DNS rule that santad removes when its answer's TTL runs out", Message: Message{V: 1, Op: OpAdd, Seq: 20,
		Socket: 1<<40 + 7, Rules: []Rule{{
			Conditions: []Condition{{Offset: 2, Pattern: Bytes("\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03www\x07example\x03com\x00\x00\x01\x00\x01")}},
			Processors: []Processor{{Kind: KindCopy, Length: 2}, {Kind: KindPut, ReplyOffset: 2,
				Template: Bytes("\x81\x80\x00\x01\x00\x01\x00\x00\x00\x00\x03www\x07example\x03com\x00\x00\x01\x00\x01" +
					"\xc0\x0c\x00\x01\x00\x01\x00\x00\x01\x2c\x00\x04\xc6\x13\x00\x01")}},
			ReplyLen: 49, Expires: 1795000000}}}},
	{Name: "list_rules response: a rule tagged by the controller that added it", Message: Message{V: 1, Op: OpListRules, Seq: 21,
		Rules: []Rule{{ID: 9, Version: 2,
			Conditions: []Condition{{Offset: 0, Pattern: Bytes("get k\r\n")}},
			Processors: []Processor{{Kind: KindPut, Template: Bytes("VALUE k 0 1\r\nv\r\nEND\r\n")}},
			ReplyLen:   21, Tag: "santa-memcached"}}}},
	{Name: "list rules in pages: the rules tagged santa-dns after rule 41, at most 2", Message: Message{V: 1, Op: OpListRules, Seq: 22,
		Socket: 4097, After: 41, Limit: 2, Tag: "santa-dns"}},
	{Name: "list_rules response: a page, more rules follow", Message: Message{V: 1, Op: OpListRules, Seq: 22,
		Rules: []Rule{
			{ID: 42, Version: 1, Conditions: []Condition{{Offset: 12, Pattern: Bytes("\x01a\x00")}},
				Processors: []Processor{{Kind: KindCopy, Length: 2}, {Kind: KindPut, ReplyOffset: 2, Template: Bytes{0x81, 0x80}}},
				ReplyLen:   4, Tag: "santa-dns"},
			{ID: 300, Version: 3, Conditions: []Condition{{Offset: 12, Pattern: Bytes("\x01b\x00")}},
				Processors: []Processor{{Kind: KindCopy, Length: 2}, {Kind: KindPut, ReplyOffset: 2, Template: Bytes{0x81, 0x83}}},
				ReplyLen:   4, Expires: 1795000000, Tag: "santa-dns"}},
		More: true}},
	{Name: "delete every rule tagged santa-http", Message: Message{V: 1, Op: OpDelete, Seq: 23, Socket: 4097, Tag: "santa-http"}},
	{Name: "delete by tag response: the ids deleted", Message: Message{V: 1, Op: OpDelete, Seq: 23, IDs: []uint64{7, 8, 65536}}},
	// 64-bit fields hold values past 32 bits, and past 63 (where a signed
	// 64-bit integer, or a JSON number read as a double, would break)
	{Name: "list rules in pages after a rule id past 2^32, seq and cookie past 2^63", Message: Message{V: 1, Op: OpListRules,
		Seq: 1<<63 + 24, Socket: 1<<63 + 4097, After: 1<<32 + 41, Limit: 2}},
	{Name: "list_rules response: ids and expiry past 2^32, the last id and version", Message: Message{V: 1, Op: OpListRules, Seq: 1<<32 + 24,
		Rules: []Rule{
			{ID: 1<<32 + 42, Version: 1<<32 - 1, Conditions: []Condition{{Offset: 12, Pattern: Bytes("\x01a\x00")}},
				Processors: []Processor{{Kind: KindPut, Template: Bytes{0x81, 0x80}}}, ReplyLen: 2, Expires: 1<<32 + 1},
			{ID: 1<<64 - 1, Version: 1, Conditions: []Condition{{Offset: 12, Pattern: Bytes("\x01b\x00")}},
				Processors: []Processor{{Kind: KindPut, Template: Bytes{0x81, 0x83}}}, ReplyLen: 2, Expires: 1<<64 - 1,
				Guards: []Guard{{Slot: 1, Version: 1<<64 - 1}}}},
		More: true}},
	{Name: "list sockets response: cookie, counts, hits and reply bytes past 2^32", Message: Message{V: 1, Op: OpListSockets, Seq: 25,
		Sockets: []SocketInfo{{Cookie: 1<<64 - 1, Family: 4, Protocol: 17, Address: Bytes{198, 18, 0, 1}, Port: 53, Owner: 1<<32 - 1,
			Rules: 1<<32 + 5, TemplateBytes: 1<<40 + 9, Hits: 1<<63 + 77, ReplyBytes: 1<<64 - 1, PID: 1<<32 - 1}}}},
	{Name: "stats response: hits and bytes past 2^32 and 2^63", Message: Message{V: 1, Op: OpStats, Seq: 26,
		Stats: []RuleStats{{ID: 1<<32 + 3, Hits: 1<<32 + 1, Bytes: 1<<63 + 1}, {ID: 1<<64 - 1, Hits: 1<<64 - 1, Bytes: 1<<64 - 1}}}},
	{Name: "health response: counters and sizes past 2^32", Message: Message{V: 1, Op: OpHealth, Seq: 27,
		Daemon: &DaemonInfo{Version: "0.3.0", Protocol: 1, PID: 1<<32 - 1, UptimeSeconds: 1<<32 + 7, Sockets: 1<<32 + 1,
			Rules: 1 << 33, MaxRules: 1 << 34, DataBytes: 1 << 40, MaxDataBytes: 1 << 41, UID: 1<<32 - 2,
			QuotaRules: 1<<32 + 1, QuotaBytes: 1 << 63, UsedRules: 1 << 32, UsedBytes: 1<<63 + 1, QuotaRulesets: 1<<32 + 3, UsedRulesets: 1<<32 + 2},
		Counters: map[string]uint64{"answered": 1<<32 + 9, "pass_no_match": 1<<63 + 5, "tcp_answered": 1<<64 - 1}}},
	{Name: "delete rules with ids past 2^32 and 2^63, by a cookie past 2^32", Message: Message{V: 1, Op: OpDelete, Seq: 28, Socket: 1<<32 + 4097,
		IDs: []uint64{1 << 32, 1<<63 + 1, 1<<64 - 1}}},
}

const skippedKeysPath = "../testdata/protocol/skipped_keys.json"

// skippedKeyVectors are santad messages with keys this version does not
// know, as a newer santad may send: clients skip them (and their values, of
// any type), santad would refuse them. extend adds them to the message's
// generic form.
var skippedKeyVectors = []struct {
	name   string
	msg    Message
	extend func(m map[any]any)
}{
	{"list_rules response with a key of a later version holding a map", Message{V: 1, Op: OpListRules, Seq: 5, Rules: []Rule{{
		ID: 3, Version: 1, Conditions: []Condition{{Pattern: Bytes("Hello")}},
		Processors: []Processor{{Kind: KindPut, Template: Bytes("COMSYS")}}, ReplyLen: 6}}},
		func(m map[any]any) {
			m[uint64(63)] = map[any]any{uint64(0): "later", uint64(1): []any{uint64(1), uint64(2), []byte{0}}}
		}},
	{"list_rules response whose rule and condition have keys of a later version", Message{V: 1, Op: OpListRules, Seq: 6, Rules: []Rule{{
		ID: 4, Version: 2, Conditions: []Condition{{Offset: 2, Pattern: Bytes{1, 0}}},
		Processors: []Processor{{Kind: KindCopy, Length: 2}}, ReplyLen: 2, Tag: "t"}}, More: true},
		func(m map[any]any) {
			rule := m[uint64(9)].([]any)[0].(map[any]any)
			rule[uint64(40)] = []byte{0xff, 0xfe}
			rule[uint64(2)].([]any)[0].(map[any]any)[uint64(9)] = true
		}},
	{"health response whose daemon info has a key of a later version", Message{V: 1, Op: OpHealth, Seq: 7,
		Daemon: &DaemonInfo{Version: "9.9.9", Protocol: 1, PID: 42}, Counters: map[string]uint64{"answered": 1}},
		func(m map[any]any) { m[uint64(16)].(map[any]any)[uint64(30)] = "later" }},
	{"bind response whose socket info has a key of a later version", Message{V: 1, Op: OpBind, Seq: 8, Sockets: []SocketInfo{{
		Cookie: 4097, Family: 4, Protocol: 17, Address: Bytes{198, 18, 0, 1}, Port: 53}}},
		func(m map[any]any) { m[uint64(11)].([]any)[0].(map[any]any)[uint64(25)] = uint64(1) << 40 }},
}

// A client skips keys it does not know in santad's messages; santad
// refuses them in requests.
func TestSkippedKeys(t *testing.T) {
	if *update {
		out := make([]Vector, len(skippedKeyVectors))
		for i, v := range skippedKeyVectors {
			b, err := Encode(&v.msg)
			if err != nil {
				t.Fatal(err)
			}
			var generic map[any]any
			if err := cbor.Unmarshal(b, &generic); err != nil {
				t.Fatal(err)
			}
			v.extend(generic)
			if b, err = encMode.Marshal(generic); err != nil {
				t.Fatal(err)
			}
			out[i] = Vector{Name: v.name, Message: v.msg, CBOR: hex.EncodeToString(b)}
		}
		writeVectors(t, skippedKeysPath, out)
	}
	for _, v := range readVectors(t, skippedKeysPath, len(skippedKeyVectors)) {
		b, err := hex.DecodeString(v.CBOR)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := Decode(b); err == nil {
			t.Errorf("%s: santad's decoder took %+v, want it refused", v.Name, m)
		}
		m, err := DecodeFromSantad(b)
		if err != nil {
			t.Errorf("%s: a client's decoder refused it: %v", v.Name, err)
		} else if !reflect.DeepEqual(*m, v.Message) {
			t.Errorf("%s: decoded %+v\nwant %+v", v.Name, *m, v.Message)
		}
	}
}

func writeVectors(t *testing.T, path string, vectors []Vector) {
	js, err := json.MarshalIndent(vectors, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(js, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

// readVectors reads the vectors at path, which must be as many as the test has.
func readVectors(t *testing.T, path string, want int) []Vector {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var vectors []Vector
	if err := json.Unmarshal(data, &vectors); err != nil {
		t.Fatal(err)
	}
	if len(vectors) != want {
		t.Fatalf("%s has %d vectors, the test %d: run go test ./api -update", path, len(vectors), want)
	}
	return vectors
}

func TestVectors(t *testing.T) {
	if *update {
		out := make([]Vector, len(vectorMessages))
		for i, v := range vectorMessages {
			b, err := Encode(&v.Message)
			if err != nil {
				t.Fatal(err)
			}
			v.CBOR = hex.EncodeToString(b)
			out[i] = v
		}
		writeVectors(t, vectorsPath, out)
	}
	for _, v := range readVectors(t, vectorsPath, len(vectorMessages)) {
		want, err := hex.DecodeString(v.CBOR)
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		got, err := Encode(&v.Message)
		if err != nil {
			t.Fatalf("%s: encode: %v", v.Name, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: encoded\n%x\nwant\n%x", v.Name, got, want)
		}
		dec, err := Decode(want)
		if err != nil {
			t.Fatalf("%s: decode: %v", v.Name, err)
		}
		if !reflect.DeepEqual(*dec, v.Message) {
			t.Errorf("%s: decoded %+v\nwant %+v", v.Name, *dec, v.Message)
		}
	}
}

// Both decoders refuse what is not a message of the protocol; santad's
// also refuses unknown keys (TestSkippedKeys).
func TestDecodeRefuses(t *testing.T) {
	for name, hexMsg := range map[string]string{
		"unknown key":     "a2000118ff01",     // {0:1, 255:1}
		"duplicate key":   "a200010002",       // {0:1, 0:2}
		"not a map":       "83010203",         // [1,2,3]
		"trailing bytes":  "a1000100",         // {0:1} 0
		"indefinite map":  "bf0001ff",         // {_ 0:1}
		"negative op":     "a12001",           // {-1:1}
		"text where uint": "a1016161",         // {1:"a"}
		"tag":             "a100c11a5f5e1000", // {0: 1(...)}
		"truncated":       "a2000101",
		"empty":           "",
	} {
		b, err := hex.DecodeString(hexMsg)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := Decode(b); err == nil {
			t.Errorf("%s: decoded %+v, want an error", name, m)
		}
		if m, err := DecodeFromSantad(b); err == nil && name != "unknown key" && name != "negative op" { // both keys it does not know
			t.Errorf("%s: a client's decoder took %+v, want an error", name, m)
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, v := range vectorMessages {
		b, _ := Encode(&v.Message)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_, boundErr := DecodedBound(data)
		m, err := Decode(data)
		if err != nil {
			return
		}
		if boundErr != nil { // santad bounds a request before it decodes it
			t.Fatalf("DecodedBound refuses %x, which decodes: %v", data, boundErr)
		}
		// whatever decodes must re-encode, and its encoding must be a fixed
		// point (explicit zeros, which encoders omit, may decode but vanish)
		b, err := Encode(m)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", m, err)
		}
		m2, err := Decode(b)
		if err != nil {
			t.Fatalf("decode re-encoded %x: %v", b, err)
		}
		b2, err := Encode(m2)
		if err != nil || !bytes.Equal(b, b2) {
			t.Fatalf("encoding not stable: %x then %x (%v)", b, b2, err)
		}
	})
}
