package dataplane

import (
	"fmt"
	"testing"
)

// The verifier sees the map sizes and the bucket mask (a frozen constant), so
// a program that verifies with the defaults may still be refused at the
// edges. Every extreme Config must load, and answer a request.
func TestLoadExtremeConfigs(t *testing.T) {
	requireRoot(t)
	configs := []Config{
		{HashBits: 8, MaxRules: 1, DataMiB: 1},
		{HashBits: 24, MaxRules: 1, DataMiB: 1},
		{HashBits: 8, MaxRules: 2 << 20, DataMiB: 1},
		{HashBits: 24, MaxRules: 2 << 20, DataMiB: 1},
		{HashBits: 8, MaxRules: 2 << 20, MaxRulesets: 4, DataMiB: 1, SampleRingKiB: 4},
	}
	e := newEnv(t, Config{HashBits: 8, MaxRules: 1, DataMiB: 1})
	c, s := fixtureAddrs(e, false, 7400)
	sock := e.socket(s, false)
	for _, cfg := range configs {
		t.Run(fmt.Sprintf("bits%d-rules%d-rulesets%d-data%d", cfg.HashBits, cfg.MaxRules, cfg.MaxRulesets, cfg.DataMiB), func(t *testing.T) {
			d, err := Load(cfg)
			if err != nil {
				t.Fatalf("load %+v: %v", cfg, err)
			}
			defer d.Close()
			watchLoopbackAddresses(t, e.tb, d)
			if err := d.Bind(e.sock(sock), SampleOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := d.AddRules(sock, []Rule{reply("Hello", "COMSYS")}); err != nil {
				t.Fatal(err)
			}
			req := request(c, s, "Hello")
			frame, want := req.build(t), req.answer([]byte("COMSYS")).build(t)
			var ret uint32
			var out []byte
			err = e.tb.Server.Do(func() error {
				var err error
				ret, out, err = d.Program().Test(frame)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if ret != xdpTx || string(out) != string(want) {
				t.Errorf("verdict %d, reply %x; want %d, %x", ret, out, xdpTx, want)
			}
			if cfg.MaxRules == 1 {
				// the only slot is taken: the next rule is refused, not half installed
				if _, err := d.AddRules(sock, []Rule{reply("World", "X")}); err == nil {
					t.Error("a second rule was accepted with MaxRules 1")
				}
			}
		})
	}
}

// Config documents MaxRulesets as "the number of rule sets; every socket with
// rules holds one, and an atomic replace briefly holds a second". So
// MaxRulesets 2 (the minimum Load accepts) must hold one socket's rules and
// let it replace them, again and again. (Rule set id 0 is reserved, and a
// replaced id is quarantined for a second: both used to eat into the count.)
func TestMinimumRulesetsHoldOneSocket(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, Config{MaxRulesets: 2})
	c, s := fixtureAddrs(e, false, 7401)
	sock := e.socket(s, false)
	if err := e.d.Bind(e.sock(sock), SampleOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.AddRules(sock, []Rule{reply("Hello", "COMSYS")}); err != nil {
		t.Fatalf("MaxRulesets 2 cannot hold one socket's rules: %v", err)
	}
	req := request(c, s, "Hello")
	e.expect("hello", req.build(t), xdpTx, req.answer([]byte("COMSYS")).build(t), "answered")
	for i := 0; i < 3; i++ {
		text := fmt.Sprintf("again%d", i)
		if _, err := e.d.ReplaceRules(sock, []Rule{reply("Hello", text)}); err != nil {
			t.Fatalf("MaxRulesets 2: replace %d of the only socket's rules: %v", i+1, err)
		}
		e.expect(text, req.build(t), xdpTx, req.answer([]byte(text)).build(t), "answered")
	}
}
