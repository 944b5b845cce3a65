package daemon

import (
	"reflect"
	"testing"
)

// dist/santad.yaml documents the defaults: read, it is DefaultConfig but for
// its example interface.
func TestDistConfigHoldsTheDefaults(t *testing.T) {
	c, err := LoadConfig("../../dist/santad.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultConfig()
	want.Interfaces = []string{"eth0"}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("dist/santad.yaml reads as\n%+v\nwant the defaults\n%+v", c, want)
	}
}
