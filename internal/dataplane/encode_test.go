package dataplane

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"reflect"
	"testing"
	"unsafe"
)

// encode returns v's bytes as encoding/binary lays them out: the reference.
func encode(v any) []byte {
	var b bytes.Buffer
	if err := binary.Write(&b, binary.LittleEndian, v); err != nil {
		panic(err)
	}
	return b.Bytes()
}

// fillRandom sets every exported field of v (recursively) to random bits.
func fillRandom(rng *rand.Rand, v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				fillRandom(rng, v.Field(i))
			}
		}
	case reflect.Array:
		for i := 0; i < v.Len(); i++ {
			fillRandom(rng, v.Index(i))
		}
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(rng.Uint64())
	}
}

func testEncodeInto[T santaSantaRule | santaSantaRuleset](t *testing.T) {
	var zero T
	if binary.Size(&zero) != int(unsafe.Sizeof(zero)) {
		t.Fatalf("%T: binary.Size %d, unsafe.Sizeof %d", zero, binary.Size(&zero), unsafe.Sizeof(zero))
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 10000; i++ {
		var v T
		if i > 0 {
			fillRandom(rng, reflect.ValueOf(&v).Elem())
		}
		want := encode(&v)
		got := bytes.Repeat([]byte{0xee}, len(want)+8)
		if n := encodeInto(got, &v); n != len(want) {
			t.Fatalf("%T: encodeInto wrote %d bytes, encode %d", v, n, len(want))
		}
		if !bytes.Equal(got[:len(want)], want) {
			t.Fatalf("%T %+v:\nencodeInto %x\nencode     %x", v, v, got[:len(want)], want)
		}
	}
}

// encodeInto is a drop-in for copy(dst, encode(v)) in install and writeRuleset.
func TestEncodeIntoMatchesEncode(t *testing.T) {
	testEncodeInto[santaSantaRule](t)
	testEncodeInto[santaSantaRuleset](t)
}

func BenchmarkEncodeRule(b *testing.B) {
	var v santaSantaRule
	fillRandom(rand.New(rand.NewPCG(5, 6)), reflect.ValueOf(&v).Elem())
	dst := make([]byte, 256)
	b.Run("encode", func(b *testing.B) {
		for b.Loop() {
			copy(dst, encode(&v))
		}
	})
	b.Run("encodeInto", func(b *testing.B) {
		for b.Loop() {
			encodeInto(dst, &v)
		}
	})
}
