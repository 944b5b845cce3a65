package rulefile

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/santa-offload/santa/api"
)

const yamlFile = `
rules:
  - priority: 3
    conditions:
      - {offset: 0, text: Hello}
      - {offset: 8, hex: "00ff"}
    processors:
      - put: {at: 0, base64: Q09NU1lT}
      - copy: {at: 6, from: 5, length: 2}
    reply_len: 8
`

var want = []api.Rule{{
	Priority:   3,
	Conditions: []api.Condition{{Offset: 0, Pattern: api.Bytes("Hello")}, {Offset: 8, Pattern: api.Bytes{0, 0xff}}},
	Processors: []api.Processor{{Kind: api.KindPut, Template: api.Bytes("COMSYS")},
		{Kind: api.KindCopy, ReplyOffset: 6, SrcOffset: 5, Length: 2}},
	ReplyLen: 8,
}}

func TestParseYAMLAndJSONRoundTrip(t *testing.T) {
	got, err := Parse([]byte(yamlFile))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("YAML parsed to %+v\nwant %+v", got, want)
	}
	js, err := json.Marshal(FromAPI(got))
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse(js)
	if err != nil {
		t.Fatalf("parse %s: %v", js, err)
	}
	if !reflect.DeepEqual(again, want) {
		t.Fatalf("JSON %s parsed to %+v", js, again)
	}
	if !strings.Contains(string(js), `"text":"Hello"`) || !strings.Contains(string(js), `"hex":"00ff"`) {
		t.Errorf("printable bytes should print as text, others as hex: %s", js)
	}
}

func TestParseErrors(t *testing.T) {
	for file, wantErr := range map[string]string{
		"rules:\n- conditions: [{offset: 0}]\n":                                        "condition 0: give the bytes as exactly one of",
		"rules:\n- conditions: [{offset: 0, text: a, hex: '61'}]\n":                    "exactly one of",
		"rules:\n- conditions: [{offset: 0, hex: 'zz'}]\n":                             "hex",
		"rules:\n- processors: [{put: {at: 0, text: a}, copy: {at: 0}}]\n":             "processor 0: give exactly one of put or copy",
		"rules:\n- processors: [{}]\n":                                                 "exactly one of put or copy",
		"rules:\n- reply: 5\n":                                                         "field reply not found",
		`{"rules": [{"conditions": [{"offset": 0, "text": "a"}], "bogus": 1}]}`:        "unknown field",
		`{"rules": [{"conditions": [{"offset": 0, "base64": "!!"}], "reply_len": 1}]}`: "base64",
	} {
		if _, err := Parse([]byte(file)); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%q: %v, want an error containing %q", file, err, wantErr)
		}
	}
}
