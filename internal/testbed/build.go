package testbed

import (
	"fmt"
	"os/exec"
	"path/filepath"
)

// GoBuild builds each main package (e.g. "./cmd/santad") of the module at
// root into dir, named after the package's directory.
func GoBuild(dir, root string, pkgs ...string) error {
	for _, p := range pkgs {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, filepath.Base(p)), p)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", p, err, out)
		}
	}
	return nil
}
