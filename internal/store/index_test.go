package store

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestIndexFollowsTheTable: after random inserts, claims, state changes
// (from many goroutines at once) and deletes, the in-memory committed
// memory and taken ids and names are what the table says, also after a
// reopen.
func TestIndexFollowsTheTable(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "clade.db")
	st, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	states := []string{StateCreating, StateRunning, StateSuspending, StateSleeping, StateWaking, StateStopped, StateDestroying}
	check := func(st *Store, when string) {
		t.Helper()
		got, _ := st.CommittedMemoryMiB(ctx)
		want, err := committedMemoryQuery(ctx, st)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("%s: committed memory %d MiB in memory, %d in the table", when, got, want)
		}
		recs, err := st.ListSandboxes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if !st.Taken(r.ID) || (r.Name != "" && !st.Taken(r.Name)) {
				t.Fatalf("%s: %s (%q) is recorded but not taken", when, r.ID, r.Name)
			}
		}
		if n := len(st.idx.rows); n != len(recs) {
			t.Fatalf("%s: the index holds %d sandboxes, the table %d", when, n, len(recs))
		}
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			var mine []string
			for i := range 150 {
				switch op := r.IntN(10); {
				case op < 3 || len(mine) == 0:
					id := fmt.Sprintf("%02d%014d", w, i)
					sb := Sandbox{ID: id, Image: "img", State: states[r.IntN(len(states))], MemoryMiB: 1 + r.IntN(1024)}
					if r.IntN(2) == 0 {
						sb.Name = fmt.Sprintf("n%d-%d", w, i)
					}
					insert := st.InsertSandbox
					if r.IntN(2) == 0 {
						insert = st.ClaimPoolSandbox
					}
					if err := insert(ctx, sb); err != nil {
						t.Error(err)
						return
					}
					mine = append(mine, id)
				case op < 6:
					id := mine[r.IntN(len(mine))]
					_ = st.SetState(ctx, id, states[r.IntN(len(states))], "")
				case op < 8:
					id := mine[r.IntN(len(mine))]
					cur, err := st.GetSandbox(ctx, id)
					if err == nil {
						_ = st.Transition(ctx, id, cur.State, states[r.IntN(len(states))], "")
					}
					_ = st.Transition(ctx, id, StateDestroying, StateStopped, "") // often the wrong from: no change
				default:
					k := r.IntN(len(mine))
					if err := st.DeleteSandbox(ctx, mine[k]); err != nil {
						t.Error(err)
						return
					}
					mine = append(mine[:k], mine[k+1:]...)
				}
			}
		}()
	}
	wg.Wait()
	check(st, "after the writes")
	// A name taken stays refused by the table; the index agrees.
	if err := st.InsertSandbox(ctx, Sandbox{ID: "dup0000000000001", Name: "n0-0", Image: "img", State: StateRunning, MemoryMiB: 5}); err == nil && !st.Taken("n0-0") {
		t.Fatal("a name the table took is not taken in the index")
	}
	check(st, "after a duplicate name")
	st.Close()
	st2, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	check(st2, "after a reopen")
}

// TestImageCacheFollowsWrites: a cached image record is never served
// after a write changed or removed it.
func TestImageCacheFollowsWrites(t *testing.T) {
	ctx := t.Context()
	st := openTest(t)
	if _, _, err := st.PutImage(ctx, Image{Name: "app", RootFS: "/roots/a"}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second read is from the cache
		if img, err := st.GetImage(ctx, "app"); err != nil || img.RootFS != "/roots/a" {
			t.Fatalf("get: %+v %v", img, err)
		}
	}
	if _, _, err := st.PutImage(ctx, Image{Name: "app", RootFS: "/roots/b"}); err != nil {
		t.Fatal(err)
	}
	if img, _ := st.GetImage(ctx, "app"); img.RootFS != "/roots/b" {
		t.Fatalf("after a replace: %+v", img)
	}
	if img, err := st.SetImageSnapshot(ctx, "app", "snap1"); err != nil || img.Snapshot != "snap1" {
		t.Fatalf("set snapshot: %+v %v", img, err)
	}
	if img, _ := st.GetImage(ctx, "app"); img.Snapshot != "snap1" {
		t.Fatalf("after setting the snapshot: %+v", img)
	}
	if _, err := st.DeleteImage(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetImage(ctx, "app"); err == nil {
		t.Fatal("a removed image is still served")
	}
	if ok, err := st.AdoptImage(ctx, Image{Name: "app", RootFS: "/roots/c"}); err != nil || !ok {
		t.Fatalf("adopt: %v %v", ok, err)
	}
	if img, _ := st.GetImage(ctx, "app"); img.RootFS != "/roots/c" {
		t.Fatalf("after an adopt: %+v", img)
	}
}

// TestAdmissions: the committed memory comes with the ids of what it
// counts lately (within the window) and of what is being made or woken,
// read at one moment; a sandbox put to sleep and woken again is recent
// again.
func TestAdmissions(t *testing.T) {
	ctx := t.Context()
	st := openTest(t)
	for _, sb := range []Sandbox{{ID: "c1", State: StateCreating, MemoryMiB: 100}, {ID: "r1", State: StateRunning, MemoryMiB: 200},
		{ID: "s1", State: StateSleeping, MemoryMiB: 400}} {
		sb.Image = "img"
		if err := st.InsertSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	a := st.Admissions(time.Hour)
	if a.CommittedMiB != 300 || a.StartingMiB != 100 || !slices.Equal(a.Recent, []string{"c1", "r1"}) || !slices.Equal(a.Starting, []string{"c1"}) {
		t.Fatalf("admissions: %+v", a)
	}
	// Nothing began to hold memory within the last 0 s but what starts.
	if a := st.Admissions(0); !slices.Equal(a.Recent, []string{"c1"}) {
		t.Fatalf("with no window: %+v", a)
	}
	if err := st.Transition(ctx, "c1", StateCreating, StateRunning, ""); err != nil {
		t.Fatal(err)
	}
	if err := st.Transition(ctx, "s1", StateSleeping, StateWaking, ""); err != nil {
		t.Fatal(err)
	}
	a = st.Admissions(time.Hour)
	if a.CommittedMiB != 700 || a.StartingMiB != 400 || !slices.Equal(a.Recent, []string{"c1", "r1", "s1"}) || !slices.Equal(a.Starting, []string{"s1"}) {
		t.Fatalf("after c1 ran and s1 began to wake: %+v", a)
	}
	if got, _ := st.CommittedMemoryMiB(ctx); got != a.CommittedMiB {
		t.Fatalf("committed %d, admissions say %d", got, a.CommittedMiB)
	}
}

// committedMemoryQuery is CommittedMemoryMiB asked of the table itself:
// the index must agree with it.
func committedMemoryQuery(ctx context.Context, s *Store) (int, error) {
	var n sql.NullInt64
	err := s.db.QueryRowContext(ctx, `SELECT SUM(memory_mib) FROM sandboxes WHERE state NOT IN (?, ?)`, StateSleeping, StateStopped).Scan(&n)
	return int(n.Int64), err
}
