package dnsctl

import (
	"bytes"
	"fmt"
	"sync"
)

// How a server's treatment of record sets of several records is decided:
// the first orderAnswers answers that hold one are each asked for
// orderAsks more times; one that comes back different marks the server as
// varying them.
const (
	orderAnswers = 16
	orderAsks    = 4
)

// orderCheck finds out, once per server, whether it varies answers that
// hold a record set of several records from one reply to the next (rotates
// or shuffles the records: BIND's default rrset-order). A rule would freeze
// one order and end the rotation the server's operator relies on, so such
// answers then stay with the server.
type orderCheck struct {
	mu      sync.Mutex
	checked int  // answers found stable so far
	varies  bool // an answer came back different
	swept   bool // the rules made before varies was found are gone
}

// errVaries is why an answer with a set of several records is not
// offloaded from a server that varies them.
var errVaries = fmt.Errorf("%w: the server varies the order of records in a set (e.g. BIND's rrset-order); such answers stay with it", ErrNotOffloadable)

// check returns errVaries if a (the server's reply to q) holds a set of
// several records and the server varies such answers, asking again through
// asker until that is decided.
func (o *orderCheck) check(asker *Asker, q *Query, a Answer) error {
	if !a.SetOfSeveral {
		return nil
	}
	o.mu.Lock()
	varies, decided := o.varies, o.checked >= orderAnswers
	o.mu.Unlock()
	if varies {
		return errVaries
	}
	if decided {
		return nil
	}
	for range orderAsks {
		again, err := asker.Ask(q.Wire)
		if err != nil {
			return err
		}
		if !bytes.Equal(again, a.Reply) {
			o.mu.Lock()
			o.varies = true
			o.mu.Unlock()
			return errVaries
		}
	}
	o.mu.Lock()
	o.checked++
	o.mu.Unlock()
	return nil
}

// found reports whether the server was found to vary such answers, and
// whether this is the first call to learn it (the caller then removes the
// rules made before).
func (o *orderCheck) found() (varies, first bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	first = o.varies && !o.swept
	o.swept = o.varies
	return o.varies, first
}
