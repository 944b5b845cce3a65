// Package santa is the Go client of santad: it lets an application hand its
// own socket's rules to the rule processor, and lets operators (the santa CLI)
// and controllers manage rule sets. The protocol is docs/protocol.md; rules
// and other messages are the types of package api.
package santa

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"syscall"

	"github.com/santa-offload/santa/api"
)

// Error is santad's refusal of a request.
type Error struct {
	Op      api.Op
	Status  api.Status
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("santad: %s: %s", e.Op, e.Message) }

// Is lets errors.Is(err, santa.ErrPermission) and the like match by status.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Op == 0 && t.Message == "" && t.Status == e.Status
}

// Sentinels for errors.Is, one per failure status.
var (
	ErrMalformed   = &Error{Status: api.StatusMalformed}
	ErrInvalid     = &Error{Status: api.StatusInvalid}
	ErrPermission  = &Error{Status: api.StatusPermission}
	ErrNotFound    = &Error{Status: api.StatusNotFound}
	ErrQuota       = &Error{Status: api.StatusQuota}
	ErrFull        = &Error{Status: api.StatusFull}
	ErrVersion     = &Error{Status: api.StatusVersion}
	ErrInternal    = &Error{Status: api.StatusInternal}
	ErrUnsupported = &Error{Status: api.StatusUnsupported}
)

// Target names the socket a request is about: either a socket the caller
// holds (its fd is passed to santad, which proves ownership) or the cookie of
// a socket that already has a rule set. The zero Target names none: a call
// with it fails before anything is sent, as one with FD(-1) or Cookie(0).
type Target struct {
	fd     int    // the fd to pass, if passFD
	cookie uint64 // else the rule set's cookie
	passFD bool
}

// FD targets the socket behind this file descriptor; the fd is passed along.
func FD(fd int) Target { return Target{fd: fd, passFD: true} }

// Cookie targets the rule set of the socket with this SO_COOKIE.
func Cookie(cookie uint64) Target { return Target{cookie: cookie} }

// check refuses, before anything is sent, a target that names no socket
// (docs/api.md "Targets"): a closed fd, else sendmsg's EBADF reads as if
// the connection to santad were bad.
func (t Target) check(op api.Op) error {
	if t.passFD && t.fd >= 0 {
		var st syscall.Stat_t
		if err := syscall.Fstat(t.fd, &st); err != nil {
			return fmt.Errorf("santad %s: the target fd %d is not open: %w", op, t.fd, err)
		}
		return nil
	}
	if op == api.OpBind {
		return errors.New("santad bind: no target socket: bind needs the socket's fd (a cookie names a rule set that exists)")
	}
	if t.passFD || t.cookie == 0 {
		return fmt.Errorf("santad %s: no target socket: pass the socket's fd or name its cookie", op)
	}
	return nil
}

// Socket targets a socket the caller holds, e.g. a *net.UDPConn or a
// *net.TCPListener. Keep it alive until the call returns.
func Socket(sc syscall.Conn) (Target, error) {
	raw, err := sc.SyscallConn()
	if err != nil {
		return Target{}, err
	}
	var fd int
	if err := raw.Control(func(f uintptr) { fd = int(f) }); err != nil {
		return Target{}, err
	}
	return FD(fd), nil
}

// Client is a connection to santad. It is safe for concurrent use; requests
// are sent one at a time.
//
// A Client outlives santad's restarts (upgrades, crashes, systemctl
// restart; santad keeps its rule sets across them): it remembers the path it
// was dialed with, and a request that finds the connection closed by santad
// before santad read it (the send fails with EPIPE or ECONNRESET and no
// answer follows) is sent once more on a new connection to that path, with
// the same seq; the caller sees only its result. A refusal santad sent
// before closing (quota.connections) is returned as it is, without a
// redial. If the connection ends after the request was sent and before its
// answer, santad may or may not have carried the request out: the call
// returns an error matching ErrOutcomeUnknown, does not resend, and the next
// call dials anew first. If dialing anew fails (santad not running), the
// call returns an error naming the lost connection and the dial's failure,
// and the next call tries again. Sequence numbers go on increasing across
// redials. A Subscription is never redialed (see Subscribe).
type Client struct {
	mu   sync.Mutex // serializes calls, and guards seq
	path string
	seq  uint64
	// connMu guards conn and closed, so that Close need not wait for a
	// call; a call replaces conn only while it holds mu.
	connMu sync.Mutex
	conn   *api.Conn // nil while lost: the next call dials anew
	closed bool
}

// ErrOutcomeUnknown matches (errors.Is) the error of a call whose request
// was sent but whose connection ended before santad answered: santad may or
// may not have carried it out (e.g. it stopped or crashed meanwhile). The
// request is not sent again; the next call dials santad anew. Find out what
// happened, e.g. by listing the rules, before trying again where doing a
// request twice matters (an add would add its rules twice).
var ErrOutcomeUnknown = errors.New("santad closed the connection before answering: the request may or may not have been carried out")

// SocketPath is the santad socket Dial uses for an empty path: $SANTA_SOCKET,
// else api.DefaultSocket.
func SocketPath() string {
	if p := os.Getenv("SANTA_SOCKET"); p != "" {
		return p
	}
	return api.DefaultSocket
}

// Dial connects to santad at path ("" for SocketPath()). The Client dials
// the same path again when santad has closed the connection (see Client).
func Dial(path string) (*Client, error) {
	if path == "" {
		path = SocketPath()
	}
	c, err := api.Dial(path)
	if err != nil {
		return nil, err
	}
	return &Client{path: path, conn: c}, nil
}

// Close closes the connection. A call after Close fails (net.ErrClosed);
// a call in progress is interrupted.
func (c *Client) Close() error {
	c.connMu.Lock()
	defer c.connMu.Unlock()
	c.closed = true
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	return err
}

// current is the connection, nil if it was lost; an error once closed.
func (c *Client) current() (*api.Conn, error) {
	c.connMu.Lock()
	defer c.connMu.Unlock()
	if c.closed {
		return nil, net.ErrClosed
	}
	return c.conn, nil
}

// drop closes conn, which santad closed or which is out of step: the next
// call dials anew.
func (c *Client) drop(conn *api.Conn) {
	c.connMu.Lock()
	defer c.connMu.Unlock()
	if c.conn == conn {
		c.conn = nil
	}
	conn.Close()
}

// redial connects to c.path again. The caller holds mu.
func (c *Client) redial() (*api.Conn, error) {
	conn, err := api.Dial(c.path)
	if err != nil {
		return nil, err
	}
	c.connMu.Lock()
	defer c.connMu.Unlock()
	if c.closed {
		conn.Close()
		return nil, net.ErrClosed
	}
	c.conn = conn
	return conn, nil
}

// ended says whether err is the end of the connection: santad closed it.
func ended(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// errUnread is an exchange's failure when santad had closed the connection
// before the request was sent: santad never read it.
type errUnread struct{ send error }

func (e *errUnread) Error() string { return "santad had closed the connection: " + e.send.Error() }
func (e *errUnread) Unwrap() error { return e.send }

// call sends a request about target t (if any) and returns santad's
// response, dialing anew if santad closed the connection (see Client).
func (c *Client) call(req *api.Message, t *Target) (*api.Message, error) {
	fd := -1
	if t != nil {
		if err := t.check(req.Op); err != nil {
			return nil, err
		}
		if t.passFD {
			fd = t.fd
		} else {
			req.Socket = t.cookie
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	req.V, req.Seq = api.Version, c.seq
	conn, err := c.current()
	if err != nil {
		return nil, fmt.Errorf("santad %s: %w", req.Op, err)
	}
	if conn == nil { // lost in an earlier call
		if conn, err = c.redial(); err != nil {
			return nil, fmt.Errorf("santad %s: the connection to santad at %s was lost and dialing it again failed: %w", req.Op, c.path, err)
		}
	}
	resp, err := c.exchange(conn, req, fd)
	var unread *errUnread
	if errors.As(err, &unread) {
		// santad closed the connection before the request went out (it
		// restarted): it never saw it, so send it once more on a new one
		if conn, err = c.redial(); err != nil {
			return nil, fmt.Errorf("santad %s: the connection to santad at %s was lost (%w) and dialing it again failed: %w", req.Op, c.path, unread.send, err)
		}
		resp, err = c.exchange(conn, req, fd)
		if errors.As(err, &unread) {
			return nil, fmt.Errorf("santad %s: santad at %s closed the new connection too before reading the request: %w", req.Op, c.path, unread.send)
		}
	}
	return resp, err
}

// exchange sends req on conn and reads its answer. It returns an *errUnread
// if santad had closed conn before the request was sent, and an error
// matching ErrOutcomeUnknown if conn ended after it was sent; either way
// conn is dropped.
func (c *Client) exchange(conn *api.Conn, req *api.Message, fd int) (*api.Message, error) {
	sendErr := conn.Send(req, fd)
	if sendErr != nil && !errors.Is(sendErr, syscall.EPIPE) && !errors.Is(sendErr, syscall.ECONNRESET) {
		return nil, fmt.Errorf("santad %s: send: %w", req.Op, sendErr)
	}
	// On EPIPE santad closed the connection, perhaps refusing it with an
	// answer first (quota.connections): read it, it says why.
	resp, files, err := conn.Recv()
	for _, f := range files {
		f.Close()
	}
	if sendErr != nil {
		c.drop(conn) // santad closed it: the next call dials anew
		if err != nil && ended(err) {
			// the frame never went out whole, so santad cannot have
			// carried the request out
			return nil, &errUnread{send: sendErr}
		}
		if err != nil {
			return nil, fmt.Errorf("santad %s: send: %w", req.Op, sendErr)
		}
	} else if err != nil {
		if ended(err) {
			c.drop(conn)
			return nil, fmt.Errorf("santad %s: %w (%v)", req.Op, ErrOutcomeUnknown, err)
		}
		return nil, fmt.Errorf("santad %s: receive: %w", req.Op, err)
	}
	if resp.Status != api.StatusOK && resp.Seq == 0 { // santad could not read the request's seq (docs/protocol.md "Transport")
		return nil, &Error{Op: req.Op, Status: resp.Status, Message: resp.Error}
	}
	if resp.Seq != req.Seq || resp.Op != req.Op {
		return nil, fmt.Errorf("santad %s: response out of order (seq %d op %s, want seq %d)", req.Op, resp.Seq, resp.Op, req.Seq)
	}
	if resp.Status != api.StatusOK {
		return nil, &Error{Op: req.Op, Status: resp.Status, Message: resp.Error}
	}
	return resp, nil
}

// Health returns santad's state, the caller's quota and use, and the rule
// processor's answer and pass counters.
func (c *Client) Health() (*api.DaemonInfo, map[string]uint64, error) {
	resp, err := c.call(&api.Message{Op: api.OpHealth}, nil)
	if err != nil {
		return nil, nil, err
	}
	if resp.Daemon == nil {
		return nil, nil, errors.New("santad health: response without daemon info")
	}
	return resp.Daemon, resp.Counters, nil
}

// SampleOptions sets a rule set's miss samples: request bytes per sample
// (0 = off, at most 1472) and samples per second and CPU.
type SampleOptions struct {
	Bytes uint32
	Rate  uint32
}

// Bind gives the target socket a rule set (or returns its existing one).
func (c *Client) Bind(t Target, s SampleOptions) (api.SocketInfo, error) {
	resp, err := c.call(&api.Message{Op: api.OpBind, SampleBytes: s.Bytes, SampleRate: s.Rate}, &t)
	if err != nil {
		return api.SocketInfo{}, err
	}
	if len(resp.Sockets) != 1 {
		return api.SocketInfo{}, fmt.Errorf("santad bind: %d sockets in the response, want 1", len(resp.Sockets))
	}
	return resp.Sockets[0], nil
}

// BindPID (root) binds the socket that process pid holds as fd, with the
// miss sampling s (the zero SampleOptions: none, or leave it as it is).
func (c *Client) BindPID(pid, fd int, s SampleOptions) (api.SocketInfo, error) {
	// the protocol's fields are unsigned: -1 would name process 4294967295
	if pid < 1 || pid > math.MaxInt32 || fd < 0 || fd > math.MaxInt32 {
		return api.SocketInfo{}, fmt.Errorf("santad bind: pid %d, fd %d: want a process id from 1 and an fd from 0 (to %d)", pid, fd, math.MaxInt32)
	}
	resp, err := c.call(&api.Message{Op: api.OpBind, PID: uint32(pid), FD: uint32(fd), SampleBytes: s.Bytes, SampleRate: s.Rate}, nil)
	if err != nil {
		return api.SocketInfo{}, err
	}
	if len(resp.Sockets) != 1 {
		return api.SocketInfo{}, fmt.Errorf("santad bind: %d sockets in the response, want 1", len(resp.Sockets))
	}
	return resp.Sockets[0], nil
}

// BindPort (root) binds every UDP socket bound to port, in every process.
func (c *Client) BindPort(port uint16) ([]api.SocketInfo, error) {
	return c.BindPortProtocol(port, api.ProtocolUDP, SampleOptions{})
}

// BindPortProtocol (root) binds every socket of the IP protocol bound to
// port, in every process: the UDP sockets (api.ProtocolUDP) or the listening
// TCP sockets (api.ProtocolTCP), each with the miss sampling s (the zero
// SampleOptions: none, or leave it as it is). All or none: if one socket
// cannot be bound, none is.
func (c *Client) BindPortProtocol(port uint16, protocol uint32, s SampleOptions) ([]api.SocketInfo, error) {
	req := &api.Message{Op: api.OpBind, Port: port, Protocol: protocol, SampleBytes: s.Bytes, SampleRate: s.Rate}
	if protocol == api.ProtocolUDP {
		req.Protocol = 0 // the default, which santads before TCP support take too
	}
	resp, err := c.call(req, nil)
	if err != nil {
		return nil, err
	}
	return resp.Sockets, nil
}

// Unbind removes the target's rule set and all its rules.
func (c *Client) Unbind(t Target) error {
	_, err := c.call(&api.Message{Op: api.OpUnbind}, &t)
	return err
}

// Add installs rules, all or none, and returns their ids in order.
func (c *Client) Add(t Target, rules []api.Rule) ([]uint64, error) {
	return c.ruleIDs(api.OpAdd, t, rules)
}

// Replace swaps all of the target's rules for these, atomically.
func (c *Client) Replace(t Target, rules []api.Rule) ([]uint64, error) {
	return c.ruleIDs(api.OpReplace, t, rules)
}

// Modify changes rules in place; each rule's ID says which. All or none.
func (c *Client) Modify(t Target, rules []api.Rule) error {
	_, err := c.ruleIDs(api.OpModify, t, rules)
	return err
}

func (c *Client) ruleIDs(op api.Op, t Target, rules []api.Rule) ([]uint64, error) {
	resp, err := c.call(&api.Message{Op: op, Rules: rules}, &t)
	if err != nil {
		return nil, err
	}
	if len(resp.IDs) != len(rules) {
		return nil, fmt.Errorf("santad %s: %d ids for %d rules", op, len(resp.IDs), len(rules))
	}
	return resp.IDs, nil
}

// Delete removes rules of the target, all or none.
func (c *Client) Delete(t Target, ids []uint64) error {
	_, err := c.call(&api.Message{Op: api.OpDelete, IDs: ids}, &t)
	return err
}

// ListSockets lists the rule sets the caller may see (all of them for root).
func (c *Client) ListSockets() ([]api.SocketInfo, error) {
	resp, err := c.call(&api.Message{Op: api.OpListSockets}, nil)
	if err != nil {
		return nil, err
	}
	return resp.Sockets, nil
}

// ListRules returns the target's rules, oldest first, with ids and versions.
// It asks in pages (ListPage), so a rule set of any size can be listed; a
// rule added meanwhile may be listed or not, one deleted meanwhile may
// already be missing, and every other rule is listed once.
func (c *Client) ListRules(t Target) ([]api.Rule, error) { return c.ListTagged(t, "") }

// ListTagged is ListRules for the rules tagged tag ("": all rules).
func (c *Client) ListTagged(t Target, tag string) ([]api.Rule, error) {
	var all []api.Rule
	var after uint64
	for {
		rules, more, err := c.ListPage(t, tag, after, listPageRules)
		if err != nil {
			return nil, err
		}
		all = append(all, rules...)
		if !more {
			return all, nil
		}
		after = rules[len(rules)-1].ID
	}
}

// listPageRules is how many rules ListTagged asks for per page.
const listPageRules = 16384

// ListPage returns up to limit (0: no limit) of the target's rules tagged
// tag ("": all) whose id is above after, oldest first, and whether more
// follow: ask again with after the last id returned. santad may end a page
// early to keep it within the frame limit.
func (c *Client) ListPage(t Target, tag string, after uint64, limit uint32) ([]api.Rule, bool, error) {
	resp, err := c.call(&api.Message{Op: api.OpListRules, Tag: tag, After: after, Limit: limit}, &t)
	if err != nil {
		return nil, false, err
	}
	if resp.More && len(resp.Rules) == 0 {
		return nil, false, fmt.Errorf("list_rules: santad says more rules follow but listed none")
	}
	return resp.Rules, resp.More, nil
}

// DeleteTagged deletes every rule of the target tagged tag, all or none,
// and returns their ids (none if no rule has it).
func (c *Client) DeleteTagged(t Target, tag string) ([]uint64, error) {
	if tag == "" {
		return nil, fmt.Errorf("delete by tag: no tag given")
	}
	resp, err := c.call(&api.Message{Op: api.OpDelete, Tag: tag}, &t)
	if err != nil {
		return nil, err
	}
	return resp.IDs, nil
}

// Stats returns the statistics of the given rules of the target (all if none given).
func (c *Client) Stats(t Target, ids ...uint64) ([]api.RuleStats, error) {
	resp, err := c.call(&api.Message{Op: api.OpStats, IDs: ids}, &t)
	if err != nil {
		return nil, err
	}
	return resp.Stats, nil
}

// Sample is a miss sample: the first bytes of a request no rule answered.
type Sample struct {
	Socket     uint64
	Data       []byte
	RequestLen int
}

// Subscription streams a socket's miss samples on a connection of its own.
type Subscription struct {
	c   *Client
	seq uint64
}

// Subscribe sets the target's miss sampling and streams its samples until
// the subscription is closed. With several subscribers santad samples as
// widely as any of them asks (docs/protocol.md). The stream is not redialed:
// when santad stops or restarts, Next returns an error (the stream ended)
// and the caller subscribes again.
func Subscribe(path string, t Target, s SampleOptions) (*Subscription, error) {
	c, err := Dial(path)
	if err != nil {
		return nil, err
	}
	if _, err := c.call(&api.Message{Op: api.OpSubscribe, SampleBytes: s.Bytes, SampleRate: s.Rate}, &t); err != nil {
		c.Close()
		return nil, err
	}
	return &Subscription{c: c, seq: c.seq}, nil
}

// Next blocks for the next sample.
func (s *Subscription) Next() (Sample, error) {
	conn, err := s.c.current()
	if err == nil && conn == nil {
		err = errors.New("santad subscription: the connection was lost")
	}
	if err != nil {
		return Sample{}, err
	}
	m, files, err := conn.Recv()
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		return Sample{}, err
	}
	if m.Op != api.OpSample || m.Seq != s.seq {
		return Sample{}, fmt.Errorf("santad subscription: unexpected %s message (seq %d)", m.Op, m.Seq)
	}
	return Sample{Socket: m.Socket, Data: m.Sample, RequestLen: int(m.RequestLen)}, nil
}

// Close ends the subscription.
func (s *Subscription) Close() error { return s.c.Close() }

// Each calls f with every sample until ctx ends (it returns nil) or the
// stream fails (it returns why), and then closes the subscription.
func (s *Subscription) Each(ctx context.Context, f func(Sample)) error {
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	defer s.Close()
	for {
		smp, err := s.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		f(smp)
	}
}
