package api

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/fxamacker/cbor/v2"
)

// Bytes is a CBOR byte string that reads and writes as hex in JSON.
type Bytes []byte

func (b Bytes) MarshalJSON() ([]byte, error) { return json.Marshal(hex.EncodeToString(b)) }

func (b *Bytes) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return err
	}
	v, err := hex.DecodeString(s)
	if err != nil {
		return fmt.Errorf("bytes must be hex: %w", err)
	}
	*b = v
	return nil
}

// Messages are encoded deterministically (RFC 8949 §4.2.1) so that every
// client library produces the same bytes for the same message.
var encMode = func() cbor.EncMode {
	m, err := cbor.CoreDetEncOptions().EncMode()
	if err != nil {
		panic(err)
	}
	return m
}()

// The decoders refuse anything outside the protocol: duplicate keys,
// indefinite lengths, tags, and nesting or sizes beyond what a frame can
// hold. santad's also refuses unknown keys; a client's skips them
// (docs/protocol.md "Versioning"). santad's takes text that is not UTF-8,
// the tags of requests, so that it refuses a rule's tag as invalid, naming
// the rule and the tag (CheckTag), not the whole message as malformed.
const maxNestedLevels = 8

var decMode, lenientDecMode = newDecMode(cbor.ExtraDecErrorUnknownField, cbor.UTF8DecodeInvalid),
	newDecMode(cbor.ExtraDecErrorNone, cbor.UTF8RejectInvalid)

func newDecMode(extra cbor.ExtraDecErrorCond, utf8 cbor.UTF8Mode) cbor.DecMode {
	m, err := cbor.DecOptions{
		UTF8:              utf8,
		DupMapKey:         cbor.DupMapKeyEnforcedAPF,
		IndefLength:       cbor.IndefLengthForbidden,
		TagsMd:            cbor.TagsForbidden,
		ExtraReturnErrors: extra,
		MaxNestedLevels:   maxNestedLevels,
		MaxArrayElements:  MaxFrame / 8,
		MaxMapPairs:       4096,
		IntDec:            cbor.IntDecConvertNone,
	}.DecMode()
	if err != nil {
		panic(err)
	}
	return m
}

// Encode returns the message's CBOR encoding, without the frame header.
func Encode(m *Message) ([]byte, error) { return encMode.Marshal(m) }

// ErrMalformed marks a frame whose content is not a message of this protocol.
var ErrMalformed = errors.New("malformed message")

// Decode parses one message as santad does: the data must hold exactly
// one CBOR map, and a key this package does not know is refused.
func Decode(data []byte) (*Message, error) { return decodeWith(decMode, data) }

// DecodeFromSantad parses one message from santad as a client does: like
// Decode, but it skips keys this package does not know, which a newer
// santad may add to its responses and events.
func DecodeFromSantad(data []byte) (*Message, error) { return decodeWith(lenientDecMode, data) }

func decodeWith(mode cbor.DecMode, data []byte) (*Message, error) {
	var m Message
	if err := mode.Unmarshal(data, &m); err != nil {
		var unknown *cbor.UnknownFieldError
		if errors.As(err, &unknown) {
			// the library says only where the key sits in its map
			if name := unknownKey(data, reflect.TypeFor[Message](), ""); name != "" {
				return nil, fmt.Errorf("%w: %s", ErrMalformed, name)
			}
		}
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return &m, nil
}

// unknownKey names the smallest key of the CBOR map data, or of a map
// nested in it at path, that the struct type t does not have, e.g.
// "unknown key 12 in rules[2]"; "" if it finds none.
func unknownKey(data []byte, t reflect.Type, path string) string {
	var entries map[any]cbor.RawMessage
	if lenientDecMode.Unmarshal(data, &entries) != nil {
		return ""
	}
	fields := map[uint64]reflect.StructField{}
	for i := range t.NumField() {
		f := t.Field(i)
		key, _, _ := strings.Cut(f.Tag.Get("cbor"), ",")
		if n, err := strconv.ParseUint(key, 10, 64); err == nil {
			fields[n] = f
		}
	}
	var unknown []string
	var known []uint64
	for k := range entries {
		n, ok := k.(uint64)
		switch {
		case ok && fields[n].Name != "":
			known = append(known, n)
		case ok:
			unknown = append(unknown, strconv.FormatUint(n, 10))
		default:
			unknown = append(unknown, fmt.Sprintf("%q", fmt.Sprint(k)))
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		if path == "" {
			return "unknown key " + unknown[0]
		}
		return "unknown key " + unknown[0] + " in " + path
	}
	slices.Sort(known)
	for _, n := range known {
		f := fields[n]
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if path != "" {
			name = path + "." + name
		}
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft.Kind() == reflect.Struct:
			if s := unknownKey(entries[n], ft, name); s != "" {
				return s
			}
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			var items []cbor.RawMessage
			if lenientDecMode.Unmarshal(entries[n], &items) != nil {
				continue
			}
			for i, item := range items {
				if s := unknownKey(item, ft.Elem(), fmt.Sprintf("%s[%d]", name, i)); s != "" {
					return s
				}
			}
		}
	}
	return ""
}

// maxElementSize is the largest element of any array a Message holds (a
// Rule): decoding an array of n elements allocates at most n times it.
var maxElementSize = largestElement(reflect.TypeFor[Message](), map[reflect.Type]bool{})

func largestElement(t reflect.Type, seen map[reflect.Type]bool) int {
	if seen[t] {
		return 0
	}
	seen[t] = true
	largest := 0
	switch t.Kind() {
	case reflect.Pointer:
		largest = largestElement(t.Elem(), seen)
	case reflect.Slice:
		largest = max(int(t.Elem().Size()), largestElement(t.Elem(), seen))
	case reflect.Struct:
		for i := range t.NumField() {
			largest = max(largest, largestElement(t.Field(i).Type, seen))
		}
	}
	return largest
}

// mapEntrySize bounds what decoding one map entry allocates (an entry of
// Message.Counters; a map decoded into a struct allocates nothing), and
// decodeOverhead what decoding any message allocates besides its values
// (the Message, the decoder's own state, allocations rounded up to pages).
const (
	mapEntrySize   = 64
	decodeOverhead = 256 << 10
)

// DecodedBound bounds the memory decoding data allocates, from its CBOR
// headers alone: a frame of a few bytes per array element (empty maps,
// say) decodes to over 100 times its size. It refuses data Decode would
// refuse for its structure (truncated, nested too deeply).
func DecodedBound(data []byte) (int, error) {
	bound, rest, err := decodedBound(data, 0)
	if err == nil && len(rest) > 0 {
		err = fmt.Errorf("%w: %d bytes after the message", ErrMalformed, len(rest))
	}
	return decodeOverhead + bound, err
}

func decodedBound(data []byte, depth int) (int, []byte, error) {
	if depth > maxNestedLevels {
		return 0, nil, fmt.Errorf("%w: nested deeper than %d levels", ErrMalformed, maxNestedLevels)
	}
	major, arg, data, err := readHead(data)
	if err != nil {
		return 0, nil, err
	}
	items, each := uint64(0), 0
	switch major {
	case 2, 3: // byte and text strings: their bytes
		if arg > uint64(len(data)) {
			return 0, nil, fmt.Errorf("%w: truncated", ErrMalformed)
		}
		return int(arg), data[arg:], nil
	case 4:
		items, each = arg, maxElementSize
	case 5:
		items, each = 2*arg, mapEntrySize/2
	case 6: // a tag: the item it tags
		items = 1
	}
	if items > uint64(len(data)) { // each item takes at least a byte
		return 0, nil, fmt.Errorf("%w: truncated", ErrMalformed)
	}
	bound := int(items) * each
	for range items {
		n, rest, err := decodedBound(data, depth+1)
		if err != nil {
			return 0, nil, err
		}
		bound, data = bound+n, rest
	}
	return bound, data, nil
}

// readHead reads the head of the CBOR item data starts with: its major
// type and argument (a value, a length or a count), and what follows.
func readHead(data []byte) (major byte, arg uint64, rest []byte, err error) {
	if len(data) == 0 {
		return 0, 0, nil, fmt.Errorf("%w: truncated", ErrMalformed)
	}
	major, info := data[0]>>5, data[0]&0x1f
	data = data[1:]
	switch {
	case info < 24:
		arg = uint64(info)
	case info <= 27:
		n := 1 << (info - 24)
		if len(data) < n {
			return 0, 0, nil, fmt.Errorf("%w: truncated", ErrMalformed)
		}
		for _, b := range data[:n] {
			arg = arg<<8 | uint64(b)
		}
		data = data[n:]
	default:
		return 0, 0, nil, fmt.Errorf("%w: indefinite length or reserved header %#x", ErrMalformed, info)
	}
	return major, arg, data, nil
}

// HeaderPrefix is how many bytes of a message HeaderOf reads at most: a
// map head and three keys with 64-bit values.
const HeaderPrefix = 9 + 3*(1+9)

// HeaderOf reads a request's op and seq from the first bytes of its CBOR
// map, where the core deterministic encoding every client uses puts them
// (keys 0 v, 1 op and 2 seq, in that order), without decoding the rest.
// santad echoes them in its answer to a frame it does not decode, so that
// the client can tell which request was refused. What it cannot read is 0.
func HeaderOf(data []byte) (op Op, seq uint64) {
	major, pairs, data, err := readHead(data)
	if err != nil || major != 5 {
		return 0, 0
	}
	next := uint64(0) // the smallest key that may follow
	for range min(pairs, 3) {
		kmajor, key, rest, err := readHead(data)
		if err != nil || kmajor != 0 || key < next || key > 2 {
			break
		}
		vmajor, value, rest, err := readHead(rest)
		if err != nil || vmajor != 0 {
			break
		}
		switch key {
		case 1:
			op = Op(value)
		case 2:
			seq = value
		}
		next, data = key+1, rest
	}
	return op, seq
}
