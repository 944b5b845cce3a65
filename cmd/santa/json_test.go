package main

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
)

// TestJSONHasEveryField: --json prints zero fields too (the protocol leaves
// them out), so that a script can rely on every key: a socket without
// hits has "hits": 0, a daemon with no interface "interfaces": [].
func TestJSONHasEveryField(t *testing.T) {
	decode := func(v any) any {
		t.Helper()
		var b bytes.Buffer
		if err := printJSON(&b, v); err != nil {
			t.Fatal(err)
		}
		var out any
		if err := json.Unmarshal(b.Bytes(), &out); err != nil {
			t.Fatalf("%v\n%s", err, b.String())
		}
		return out
	}
	has := func(what string, obj any, want map[string]any) {
		t.Helper()
		m, ok := obj.(map[string]any)
		if !ok {
			t.Fatalf("%s: %v is not an object", what, obj)
		}
		for k, v := range want {
			got, ok := m[k]
			if !ok {
				t.Errorf("%s: no %q in %v", what, k, m)
				continue
			}
			if w, _ := json.Marshal(v); string(w) != string(must(json.Marshal(got))) {
				t.Errorf("%s: %q is %v, want %v", what, k, got, v)
			}
		}
	}
	socks := decode(socketsJSON([]api.SocketInfo{{Cookie: 4097, Family: 4, Protocol: 17, Address: api.Bytes{198, 18, 0, 1}, Port: 53}})).([]any)
	has("socket", socks[0], map[string]any{"cookie": 4097, "address": "c6120001", "bound": "198.18.0.1:53",
		"hits": 0, "rules": 0, "created": false, "pid": 0, "reply_bytes": 0, "owner": 0})
	status := decode(map[string]any{"daemon": &api.DaemonInfo{Version: "1"}, "counters": map[string]uint64{"answered": 0}})
	has("status", status, map[string]any{"counters": map[string]any{"answered": 0}})
	has("daemon", status.(map[string]any)["daemon"], map[string]any{"version": "1", "interfaces": []any{},
		"rules": 0, "quota_rules": 0, "used_rulesets": 0})
	has("stats", decode([]api.RuleStats{{ID: 7}}).([]any)[0], map[string]any{"id": 7, "hits": 0, "bytes": 0})
	at := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	has("top", decode(topFrame{Time: at}), map[string]any{"time": at, "answered_per_sec": 0, "rules": []any{}})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
