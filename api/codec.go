package api

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

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
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return &m, nil
}
