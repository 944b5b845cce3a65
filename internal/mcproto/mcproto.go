// Package mcproto is the client side of memcached's protocols, for Santa's
// memcached tests, stale-read checker and benchmarks: UDP framing and GETs
// (the requests Santa offloads), and writers over the text, meta and
// binary protocols on TCP and the text protocol on UDP, all behind Conn.
//
// Every function that creates a socket (DialUDP, DialText, DialMeta,
// DialBinary, DialUDPConn) creates it in the network namespace of the
// calling thread. To talk to a server in a testbed namespace, call them
// inside testbed.Do (or Side.Do); the sockets can then be used from any
// goroutine.
package mcproto

import (
	"errors"
	"time"
)

// DefaultTimeout bounds every dial and every request/reply exchange of a
// Conn.
const DefaultTimeout = 2 * time.Second

// Item is one value as memcached returns it.
type Item struct {
	Key   string
	Flags uint32
	Value []byte
	CAS   uint64 // 0 when the reply carried none (a plain get)
}

// The outcomes of a request that memcached answered and that left the
// connection usable. Every protocol maps its replies to these.
var (
	// ErrCacheMiss: Gets found no item.
	ErrCacheMiss = errors.New("mcproto: cache miss")
	// ErrNotStored: Add found the key present; Replace, Append or Prepend
	// found it absent.
	ErrNotStored = errors.New("mcproto: not stored")
	// ErrExists: CAS found the item changed since its CAS value was read.
	ErrExists = errors.New("mcproto: exists (CAS mismatch)")
	// ErrNotFound: CAS, Incr, Decr, Delete or Touch found no item.
	ErrNotFound = errors.New("mcproto: not found")
	// ErrMultiDatagram: a UDP reply spans more than one datagram, which
	// UDPClient does not reassemble.
	ErrMultiDatagram = errors.New("mcproto: UDP reply spans more than one datagram")
)

// ServerError is an error reply from memcached (text ERROR, CLIENT_ERROR,
// SERVER_ERROR, or a binary status other than the outcomes above), e.g.
// an increment of a non-numeric value. The connection stays usable.
type ServerError struct {
	Reply string // the reply line, or "status 0xNN: message" for binary
}

func (e *ServerError) Error() string { return "mcproto: server error: " + e.Reply }

// Conn writes (and reads back, with CAS) items over one memcached protocol.
// A Conn is not safe for concurrent use. Each call has a deadline of
// DefaultTimeout; after an I/O or framing error the Conn refuses further
// calls (its stream may be out of step), and Close then resets a TCP
// connection, so that a request without a reply is not sent later; the
// outcome errors above and *ServerError leave it usable.
type Conn interface {
	// Set stores value unconditionally.
	Set(key string, value []byte, flags uint32, exptime int32) error
	// Add stores value only if key is absent (else ErrNotStored).
	Add(key string, value []byte, flags uint32, exptime int32) error
	// Replace stores value only if key is present (else ErrNotStored).
	Replace(key string, value []byte, flags uint32, exptime int32) error
	// Append adds value after the present value (else ErrNotStored).
	Append(key string, value []byte) error
	// Prepend adds value before the present value (else ErrNotStored).
	Prepend(key string, value []byte) error
	// CAS stores value only if the item's CAS value is still cas
	// (ErrExists if it changed, ErrNotFound if absent).
	CAS(key string, value []byte, flags uint32, exptime int32, cas uint64) error
	// Incr adds delta to a decimal value (wrapping at 2^64) and returns
	// the result.
	Incr(key string, delta uint64) (uint64, error)
	// Decr subtracts delta from a decimal value (stopping at 0) and
	// returns the result.
	Decr(key string, delta uint64) (uint64, error)
	// Delete removes the item (ErrNotFound if absent).
	Delete(key string) error
	// Touch sets a new expiration time (ErrNotFound if absent).
	Touch(key string, exptime int32) error
	// FlushAll invalidates every item at once.
	FlushAll() error
	// Gets returns the item with its CAS value (ErrCacheMiss if absent).
	Gets(key string) (Item, error)
	// Version returns the server's version string.
	Version() (string, error)
	// Close closes the connection.
	Close() error
}

// isOutcome reports whether err is an answer of memcached after which the
// connection is still in step with the server.
func isOutcome(err error) bool {
	var se *ServerError
	return errors.Is(err, ErrCacheMiss) || errors.Is(err, ErrNotStored) ||
		errors.Is(err, ErrExists) || errors.Is(err, ErrNotFound) || errors.As(err, &se)
}
