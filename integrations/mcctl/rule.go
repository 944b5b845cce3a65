package mcctl

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/internal/mcproto"
)

// udpHeader is memcached's 8-byte UDP frame header of a single-datagram
// message after its request id: sequence 0, 1 datagram, reserved 0.
const udpHeader = "\x00\x00\x00\x01\x00\x00"

// maxReply is the largest UDP payload a rule may send: memcached sends a
// longer reply, frame header included, as several datagrams
// (UDP_MAX_PAYLOAD_SIZE), which a rule cannot.
const maxReply = 1400

// errNotOffloadable says a key's value cannot be answered by a rule.
var errNotOffloadable = errors.New("not offloadable")

// validKey reports whether memcached accepts key in a text command.
func validKey(key string) bool {
	if len(key) == 0 || len(key) > maxKeyLen {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] <= ' ' || key[i] == 0x7f {
			return false
		}
	}
	return true
}

// getReply is memcached's UDP reply to a GET of key holding v, without the
// request id.
func getReply(key string, v value) []byte {
	b := []byte(udpHeader + "VALUE " + key + " " + strconv.FormatUint(uint64(v.flags), 10) + " " +
		strconv.Itoa(len(v.data)) + "\r\n")
	b = append(b, v.data...)
	return append(b, "\r\nEND\r\n"...)
}

// getRule answers the GET of key with v while the key's slot and the epoch
// hold the versions read before v was fetched: the request id is copied,
// the rest of the reply is memcached's, byte for byte.
func getRule(key string, v value, keyVersion, epochVersion uint64) (api.Rule, error) {
	if !v.found {
		return api.Rule{}, fmt.Errorf("%w: %s: no such key", errNotOffloadable, key)
	}
	req := mcproto.EncodeUDP(0, mcproto.GetRequest(key))
	tpl := getReply(key, v)
	if 2+len(tpl) > maxReply {
		return api.Rule{}, fmt.Errorf("%w: %s: the reply (%d bytes) takes more than one datagram", errNotOffloadable, key, 2+len(tpl))
	}
	return api.Rule{
		Conditions: []api.Condition{
			{Offset: 8, Pattern: req[8:]},  // get <key>\r\n: the anchor
			{Offset: 2, Pattern: req[2:6]}, // one datagram, the first
		},
		Processors: []api.Processor{
			{Kind: api.KindCopy, ReplyOffset: 0, SrcOffset: 0, Length: 2}, // the request id
			{Kind: api.KindPut, ReplyOffset: 2, Template: tpl},
		},
		ReplyLen: uint32(2 + len(tpl)),
		MinLen:   uint32(len(req)),
		MaxLen:   uint32(len(req)),
		Guards:   []api.Guard{{Slot: KeySlot(key), Version: keyVersion}, {Slot: epochSlot, Version: epochVersion}},
	}, nil
}

// keyOf is the key whose GET rule r is (getRule's anchor condition), and
// false for any other rule.
func keyOf(r api.Rule) (string, bool) {
	for _, c := range r.Conditions {
		if c.Offset != 8 || len(c.Mask) > 0 {
			continue
		}
		key, ok := strings.CutPrefix(string(c.Pattern), "get ")
		if key, found := strings.CutSuffix(key, "\r\n"); ok && found && validKey(key) {
			return key, true
		}
	}
	return "", false
}
