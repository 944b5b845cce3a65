package httpctl

import (
	"cmp"
	"slices"

	"github.com/santa-offload/santa/api"
)

// exactRule answers exactly the request bytes req with reply: its
// conditions cover every byte of the request (in pieces of at most
// maxPattern bytes, all compared in full, the first at offset 0 and the
// longest, so every rule hangs on offset 0), and the request must be
// exactly as long (MinLen = MaxLen), so a request that differs in any
// byte, or carries anything after the header block, is not answered.
// The reply is one put of the whole response. close makes the reply end
// the connection (sent with FIN).
func exactRule(req, reply []byte, close bool) api.Rule {
	var conds []api.Condition
	for off := 0; off < len(req); off += maxPattern {
		conds = append(conds, api.Condition{Offset: uint32(off), Pattern: req[off:min(off+maxPattern, len(req))]})
	}
	return api.Rule{
		Conditions: conds,
		Processors: []api.Processor{{Kind: api.KindPut, ReplyOffset: 0, Template: reply}},
		ReplyLen:   uint32(len(reply)),
		MinLen:     uint32(len(req)),
		MaxLen:     uint32(len(req)),
		Close:      close,
	}
}

// requestOf is the request exactRule answers with rule r, and false for a
// rule exactRule does not make.
func requestOf(r api.Rule) ([]byte, bool) {
	conds := slices.SortedFunc(slices.Values(r.Conditions), func(a, b api.Condition) int { return cmp.Compare(a.Offset, b.Offset) })
	var req []byte
	for _, c := range conds {
		if int(c.Offset) != len(req) || len(c.Mask) > 0 {
			return nil, false
		}
		req = append(req, c.Pattern...)
	}
	return req, len(req) > 0 && r.MinLen == uint32(len(req)) && r.MaxLen == r.MinLen
}
