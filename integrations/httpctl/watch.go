package httpctl

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/fsnotify/fsnotify"
)

// watcher reports changes under a directory tree with inotify (through
// fsnotify): one watch per directory, added for every directory that
// exists at start and for every one created later. Every event (create,
// write, remove, rename, chmod) of an entry of a watched directory is
// reported by the entry's path; a new directory is reported by its own
// path after its subtree is watched (its files may have been written
// before the watch was in place); a lost event (the kernel's queue
// overflowed) is reported as the root itself, which affects everything.
type watcher struct {
	root    string
	w       *fsnotify.Watcher
	changed chan string
	log     *slog.Logger
	done    chan struct{}

	// unread counts the changes sent, or about to be, that the loop has
	// not taken yet; a change cuts short the fetch under way (cutFetch):
	// it may be of the changed file, whose fetch should not wait for it
	mu       sync.Mutex
	unread   int
	cutFetch context.CancelCauseFunc
}

// errFileChanged ends a fetch that a change under the root cut short.
var errFileChanged = errors.New("a file under the document root changed")

// watch starts watching the tree at root.
func watch(root string, log *slog.Logger) (*watcher, error) {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	w := &watcher{root: root, w: fw, changed: make(chan string, 4096), log: log, done: make(chan struct{})}
	if err := w.addTree(root); err != nil {
		fw.Close()
		return nil, err
	}
	go w.run()
	return w, nil
}

// addTree watches dir and every directory beneath it (symbolic links are
// not followed). A directory that cannot be watched is logged and
// skipped: its rules are still re-validated every Interval.
func (w *watcher) addTree(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir && dir == w.root {
				return err
			}
			return nil // gone meanwhile, or unreadable: the next event says more
		}
		if !d.IsDir() {
			return nil
		}
		if err := w.w.Add(p); err != nil {
			if p == w.root {
				return err
			}
			w.log.Warn("cannot watch a directory; its files are only re-validated every --interval", "dir", p, "error", err)
		}
		return nil
	})
}

func (w *watcher) run() {
	defer close(w.changed)
	for {
		select {
		case ev, ok := <-w.w.Events:
			if !ok {
				return
			}
			if ev.Has(fsnotify.Rename) || ev.Has(fsnotify.Remove) {
				w.forget(ev.Name)
			}
			if ev.Has(fsnotify.Create) {
				if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
					w.addTree(ev.Name)
				}
			}
			w.send(ev.Name)
		case err, ok := <-w.w.Errors:
			if !ok {
				return
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				w.log.Warn("inotify lost events: every rule is checked again")
				w.send(w.root)
				continue
			}
			w.log.Warn("inotify", "error", err)
		}
	}
}

// forget drops the watches of a directory that was renamed or removed,
// and of the directories beneath it: inotify's watch follows the
// directory, and fsnotify would go on reporting its events under the old
// path (or, for a directory moved within the tree, drop the watch its new
// name gets). The new name arrives as a Create and is watched afresh.
func (w *watcher) forget(p string) {
	for _, d := range w.w.WatchList() {
		if d != w.root && (d == p || strings.HasPrefix(d, p+"/")) {
			w.w.Remove(d) // may be gone already
		}
	}
}

func (w *watcher) send(p string) {
	w.mu.Lock()
	w.unread++
	if w.cutFetch != nil {
		w.cutFetch(errFileChanged)
	}
	w.mu.Unlock()
	select {
	case w.changed <- p:
	case <-w.done:
	}
}

// taken tells the watcher that the loop took a change from changed.
func (w *watcher) taken() {
	w.mu.Lock()
	w.unread--
	w.mu.Unlock()
}

// fetchContext is the context of one fetch: it ends with ctx, and with
// errFileChanged as its cause at the next change, or at once if a change
// is unread. The fetch worker fetches one request at a time; end
// releases it.
func (w *watcher) fetchContext(ctx context.Context) (fctx context.Context, end func()) {
	fctx, cancel := context.WithCancelCause(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.unread > 0 {
		cancel(errFileChanged)
	} else {
		w.cutFetch = cancel
	}
	return fctx, func() {
		w.mu.Lock()
		w.cutFetch = nil
		w.mu.Unlock()
		cancel(nil)
	}
}

// close stops watching; changed is closed once the last event is sent.
func (w *watcher) close() {
	close(w.done)
	w.w.Close()
	for range w.changed {
	}
}
