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
// (docs/protocol.md "Versioning").
var decMode, lenientDecMode = newDecMode(cbor.ExtraDecErrorUnknownField), newDecMode(cbor.ExtraDecErrorNone)

func newDecMode(extra cbor.ExtraDecErrorCond) cbor.DecMode {
	m, err := cbor.DecOptions{
		DupMapKey:         cbor.DupMapKeyEnforcedAPF,
		IndefLength:       cbor.IndefLengthForbidden,
		TagsMd:            cbor.TagsForbidden,
		ExtraReturnErrors: extra,
		MaxNestedLevels:   8,
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
