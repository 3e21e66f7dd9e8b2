package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	tea "charm.land/bubbletea/v2"
	"github.com/spf13/cobra"

	"github.com/clade-sandbox/clade/sdk"
)

func newTUICmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "tui [flags]",
		Aliases: []string{"top"},
		Short:   "A live terminal view with keys to exec, sleep, wake, snapshot, fork, remove",
		Example: "  clade tui\n  clade tui --interval 5s",
		Long: "A live view of the daemon's sandboxes (state, image, age, CPU, memory,\n" +
			"processes) and snapshots, with keys to open a shell, sleep, wake, snapshot,\n" +
			"fork and remove. Press ? in it for the keys.",
		Args: nargs(0, 0),
	}
	interval := cmd.Flags().Duration("interval", time.Second, "how often CPU and memory refresh (the list follows the daemon's events at once)")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		if *interval < 100*time.Millisecond {
			return badArg("--interval %s is too short: use at least 100ms", *interval)
		}
		tty, err := os.Open("/dev/tty")
		if err != nil {
			// Else bubbletea's words: "could not open a new TTY: open
			// /dev/tty: no such device or address".
			return errors.New("tui needs a terminal: in a script use clade ls, clade stats --no-stream or clade events --follow")
		}
		tty.Close()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel() // ends the events stream when the program quits
		m := &tuiModel{c: c, ctx: ctx, interval: *interval, width: 80, height: 24, stats: map[string]sdk.SandboxStats{}, cpu: map[string]float64{}}
		p := tea.NewProgram(m, tea.WithContext(ctx))
		_, err = p.Run()
		if errors.Is(err, tea.ErrProgramKilled) && ctx.Err() != nil {
			return nil
		}
		return err
	})
	return cmd
}

// tuiModel is the state of `clade tui`. Every daemon call runs in a
// tea.Cmd, never in Update, so the screen stays live when the daemon is
// slow or gone.
type tuiModel struct {
	c        *sdk.Client
	ctx      context.Context
	interval time.Duration

	width, height int
	snapView      bool // the snapshots view instead of the sandboxes
	help          bool

	sandboxes []sdk.Sandbox
	snapshots []sdk.Snapshot
	stats     map[string]sdk.SandboxStats
	cpu       map[string]float64
	loaded    bool
	// unreachable is the last refresh's error, nil when it worked.
	unreachable error
	lastOK      time.Time

	cursor   int    // row in the current view
	selected string // id at the cursor, kept across refreshes
	// confirm, when set, asks y/n before running the action.
	confirm *tuiAction
	// forkN collects the digits of a fork's child count.
	forkN   string
	forking bool
	status  string
	busy    map[string]string // id -> action in flight

	refreshing, again bool
	// againFull asks the refresh after the one in flight to reload the
	// lists too, not only the stats.
	againFull bool

	// The events stream drives the lists: every lifecycle event reloads
	// them at once. lastSeq is the last event seen, to resume from.
	events         <-chan tea.Msg
	live, everLive bool
	streamLost     error
	lastSeq        uint64
}

type tuiAction struct {
	prompt string
	run    func(context.Context) (string, error)
}

type (
	tuiTick    struct{}
	tuiRefresh struct {
		full      bool // sandboxes and snapshots were listed, not only stats
		sandboxes []sdk.Sandbox
		snapshots []sdk.Snapshot
		stats     []sdk.SandboxStats
		err       error
	}
	// The events stream's messages: up (every event from now on is in
	// it), an event, and its end with the error.
	tuiStreamUp  struct{}
	tuiEvent     struct{ ev sdk.Event }
	tuiStreamErr struct{ err error }
	tuiReconnect struct{}
	tuiShellDone struct {
		id  string
		err error
	}
	tuiDone struct {
		id, text string
		err      error
	}
)

func (m *tuiModel) Init() tea.Cmd {
	m.refreshing = true
	return tea.Batch(m.refresh(true), m.watch())
}

// refresh reads the stats, and with full the sandboxes and snapshots.
func (m *tuiModel) refresh(full bool) tea.Cmd {
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(m.ctx, 10*time.Second)
		defer cancel()
		r := tuiRefresh{full: full}
		if full {
			if r.sandboxes, r.err = m.c.ListSandboxes(ctx); r.err != nil {
				return r
			}
			if r.snapshots, r.err = m.c.ListSnapshots(ctx); r.err != nil {
				return r
			}
		}
		r.stats, r.err = m.c.StatsList(ctx)
		return r
	}
}

// watch opens the events stream, resuming after lastSeq, and returns the
// command that delivers its first message.
func (m *tuiModel) watch() tea.Cmd {
	ch := make(chan tea.Msg, 16)
	m.events = ch
	ctx, since := m.ctx, m.lastSeq
	go func() {
		defer close(ch)
		send := func(msg tea.Msg) bool {
			select {
			case ch <- msg:
				return true
			case <-ctx.Done():
				return false
			}
		}
		evs, err := m.c.Events(ctx, sdk.EventFilter{Follow: true, Since: since})
		if err != nil {
			send(tuiStreamErr{err})
			return
		}
		if !send(tuiStreamUp{}) {
			return
		}
		for e, err := range evs {
			if err != nil {
				send(tuiStreamErr{err})
				return
			}
			if !send(tuiEvent{e}) {
				return
			}
		}
		if ctx.Err() == nil {
			send(tuiStreamErr{errors.New("the daemon ended the events stream")})
		}
	}()
	return m.nextEvent()
}

func (m *tuiModel) nextEvent() tea.Cmd {
	ch := m.events
	return func() tea.Msg {
		if msg, ok := <-ch; ok {
			return msg
		}
		return nil
	}
}

func (m *tuiModel) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
	case tuiTick:
		if m.refreshing {
			return m, nil
		}
		// The lists follow the events; the tick refreshes the stats, and
		// everything while the daemon is away or the stream is down.
		m.refreshing = true
		return m, m.refresh(!m.loaded || m.unreachable != nil || !m.live)
	case tuiRefresh:
		m.refreshing = false
		m.apply(msg)
		if m.again {
			full := m.againFull
			m.again, m.againFull, m.refreshing = false, false, true
			return m, m.refresh(full)
		}
		return m, tea.Tick(m.interval, func(time.Time) tea.Msg { return tuiTick{} })
	case tuiStreamUp:
		m.live, m.everLive = true, true
		if m.streamLost != nil {
			m.streamLost = nil
			m.status = "events stream back"
		}
		// Whatever happened while it was down is in this reload.
		return m, tea.Batch(m.refreshNow(), m.nextEvent())
	case tuiEvent:
		m.lastSeq = msg.ev.Seq
		if strings.HasPrefix(msg.ev.Type, "exec.") {
			return m, m.nextEvent()
		}
		return m, tea.Batch(m.refreshNow(), m.nextEvent())
	case tuiStreamErr:
		// The first loss is said; a retry that fails again keeps whatever
		// the status says since (a shell's failure, an action's result).
		first := m.streamLost == nil
		m.live, m.streamLost = false, msg.err
		if sdk.IsNotFound(msg.err) {
			m.lastSeq = 0 // the events after it are gone: reload and follow from now
		}
		if !m.everLive {
			// Never up: the daemon is away, which the screen says.
			return m, tea.Tick(time.Second, func(time.Time) tea.Msg { return tuiReconnect{} })
		}
		if first {
			m.status = "events stream lost, reconnecting"
			if m.lastSeq > 0 {
				m.status += fmt.Sprintf(" from event %d", m.lastSeq)
			}
			m.status += ": " + msg.err.Error()
		}
		return m, tea.Tick(time.Second, func(time.Time) tea.Msg { return tuiReconnect{} })
	case tuiReconnect:
		return m, m.watch()
	case tuiShellDone:
		delete(m.busy, msg.id)
		if msg.err != nil {
			m.status = "shell in " + short(msg.id) + ": " + msg.err.Error()
		} else {
			m.status = "shell in " + short(msg.id) + " ended"
		}
		return m, m.refreshNow()
	case tuiDone:
		delete(m.busy, msg.id)
		if msg.err != nil {
			m.status = "error: " + msg.err.Error()
		} else {
			m.status = msg.text
		}
		return m, m.refreshNow()
	case tea.KeyPressMsg:
		// Keys typed faster than the screen reads them come one message
		// each; a paste is a tea.PasteMsg, which no key takes.
		return m.key(msg)
	}
	return m, nil
}

// refreshNow refreshes at once after an action, or right after the
// refresh in flight.
func (m *tuiModel) refreshNow() tea.Cmd {
	if m.refreshing {
		m.again, m.againFull = true, true
		return nil
	}
	m.refreshing = true
	return m.refresh(true)
}

func (m *tuiModel) apply(r tuiRefresh) {
	if r.err != nil {
		m.unreachable = r.err
		return
	}
	m.unreachable, m.lastOK = nil, time.Now()
	if r.full {
		m.loaded = true
		m.sandboxes, m.snapshots = r.sandboxes, r.snapshots
	}
	slices.SortStableFunc(m.sandboxes, func(a, b sdk.Sandbox) int { return a.CreatedAt.Compare(b.CreatedAt) })
	slices.SortStableFunc(m.snapshots, func(a, b sdk.Snapshot) int { return a.CreatedAt.Compare(b.CreatedAt) })
	next := map[string]sdk.SandboxStats{}
	for _, st := range r.stats {
		if prev, ok := m.stats[st.ID]; ok {
			m.cpu[st.ID] = sdk.CPUPercent(prev, st)
		}
		next[st.ID] = st
	}
	m.stats = next
	// Keep the cursor on the same id when rows come and go.
	ids := m.ids()
	if i := slices.Index(ids, m.selected); i >= 0 {
		m.cursor = i
	}
	m.cursor = max(0, min(m.cursor, len(ids)-1))
	m.selected = ""
	if len(ids) > 0 {
		m.selected = ids[m.cursor]
	}
}

func (m *tuiModel) ids() []string {
	var ids []string
	if m.snapView {
		for _, s := range m.snapshots {
			ids = append(ids, s.ID)
		}
		return ids
	}
	for _, s := range m.sandboxes {
		ids = append(ids, s.ID)
	}
	return ids
}

func (m *tuiModel) key(k tea.KeyPressMsg) (tea.Model, tea.Cmd) {
	key := k.String()
	if key == "ctrl+c" {
		return m, tea.Quit
	}
	if m.confirm != nil {
		a := m.confirm
		m.confirm = nil
		if key == "y" || key == "Y" {
			return m, m.do(m.selected, a.prompt, a.run)
		}
		m.status = "cancelled"
		return m, nil
	}
	if m.forking {
		switch {
		case len(key) == 1 && key[0] >= '0' && key[0] <= '9' && len(m.forkN) < 3:
			m.forkN += key
			return m, nil
		case key == "backspace" && m.forkN != "":
			m.forkN = m.forkN[:len(m.forkN)-1]
			return m, nil
		case key == "enter":
			m.forking = false
			n := 0
			fmt.Sscan(m.forkN, &n)
			if n < 1 {
				m.status = "fork: type how many children (1 or more), then enter"
				return m, nil
			}
			src := m.selected
			return m, m.do(src, "forking", func(ctx context.Context) (string, error) {
				res, err := m.c.Fork(ctx, src, n)
				if err != nil {
					return "", err
				}
				ok := 0
				for _, ch := range res.Children {
					if ch.Error == "" {
						ok++
					}
				}
				return fmt.Sprintf("forked %s: %d of %d children running", short(src), ok, n), nil
			})
		default:
			m.forking = false
			m.status = "fork cancelled"
			return m, nil
		}
	}
	if m.help {
		m.help = false
		return m, nil
	}
	ids := m.ids()
	switch key {
	case "q", "esc":
		return m, tea.Quit
	case "?", "h":
		m.help = true
	case "up", "k":
		if m.cursor > 0 {
			m.cursor--
		}
	case "down", "j":
		if m.cursor < len(ids)-1 {
			m.cursor++
		}
	case "home", "g":
		m.cursor = 0
	case "end", "G":
		m.cursor = max(0, len(ids)-1)
	case "tab", "v":
		m.snapView = !m.snapView
		m.cursor, m.status = 0, ""
	case "r":
		return m, m.refreshNow()
	}
	if m.cursor < len(ids) {
		m.selected = ids[m.cursor]
	}
	id := m.selected
	if id == "" {
		return m, nil
	}
	if m.snapView {
		switch key {
		case "f":
			m.forking, m.forkN = true, ""
		case "d", "x", "delete":
			m.confirm = &tuiAction{prompt: "removing snapshot", run: func(ctx context.Context) (string, error) {
				return "removed snapshot " + short(id), m.c.DeleteSnapshot(ctx, id)
			}}
			m.status = fmt.Sprintf("remove snapshot %s? y/n", short(id))
		}
		return m, nil
	}
	switch key {
	case "e", "enter":
		return m, m.shell(id)
	case "s":
		return m, m.do(id, "sleeping", func(ctx context.Context) (string, error) {
			_, err := m.c.Sleep(ctx, id)
			return "slept " + short(id), err
		})
	case "w":
		return m, m.do(id, "waking", func(ctx context.Context) (string, error) {
			_, err := m.c.Wake(ctx, id)
			return "woke " + short(id), err
		})
	case "p":
		return m, m.do(id, "snapshotting", func(ctx context.Context) (string, error) {
			snap, err := m.c.SnapshotSandbox(ctx, id, "")
			return fmt.Sprintf("snapshot %s of %s (tab shows snapshots)", short(snap.ID), short(id)), err
		})
	case "f":
		m.forking, m.forkN = true, ""
	case "d", "x", "delete":
		m.confirm = &tuiAction{prompt: "removing", run: func(ctx context.Context) (string, error) {
			return "removed " + short(id), m.c.DeleteSandbox(ctx, id)
		}}
		m.status = fmt.Sprintf("remove sandbox %s and all its files? y/n", short(id))
	}
	return m, nil
}

// shell suspends the screen for an interactive shell in sandbox id, bash
// if it has one: `clade exec -it ID` of this same binary, the path a
// person takes, which wakes a sleeping sandbox. The screen is back when
// the shell exits.
func (m *tuiModel) shell(id string) tea.Cmd {
	self, err := os.Executable()
	if err != nil {
		m.status = "shell: " + err.Error()
		return nil
	}
	var args []string
	if host != "" {
		args = append(args, "--host", host)
	}
	args = append(args, "exec", "-it", id, "--", "sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash; fi; exec sh")
	if m.busy == nil {
		m.busy = map[string]string{}
	}
	m.busy[id] = "shell"
	m.status = "shell in " + short(id) + "..."
	cmd := exec.Command(self, args...)
	// On a terminal stderr is clade exec's own (the shell's is on the
	// pty): keep its last line to say why a shell could not start.
	said := &lastLine{}
	cmd.Stderr = io.MultiWriter(os.Stderr, said)
	return tea.ExecProcess(cmd, func(err error) tea.Msg {
		// A code is the shell's own (its last command's), or clade exec's
		// 1 when it could not start one: say it, as what it printed is
		// gone with the shell's screen.
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() > 0 {
			if msg := said.String(); strings.HasPrefix(msg, "clade: ") {
				err = errors.New(strings.TrimPrefix(msg, "clade: "))
			} else {
				err = fmt.Errorf("ended with exit code %d", ee.ExitCode())
			}
		}
		return tuiShellDone{id: id, err: err}
	})
}

// lastLine keeps the last non-empty line written to it (of at most 512
// bytes).
type lastLine struct {
	mu   sync.Mutex
	cur  []byte
	last string
}

func (l *lastLine) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range p {
		switch {
		case c == '\n' || c == '\r':
			if s := strings.TrimSpace(string(l.cur)); s != "" {
				l.last = s
			}
			l.cur = l.cur[:0]
		case len(l.cur) < 512:
			l.cur = append(l.cur, c)
		}
	}
	return len(p), nil
}

func (l *lastLine) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := strings.TrimSpace(string(l.cur)); s != "" {
		return s
	}
	return l.last
}

// do runs an action on id in the background; the row shows what.
func (m *tuiModel) do(id, what string, run func(context.Context) (string, error)) tea.Cmd {
	if m.busy == nil {
		m.busy = map[string]string{}
	}
	m.busy[id] = what
	m.status = what + " " + short(id) + "..."
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(m.ctx, 5*time.Minute)
		defer cancel()
		text, err := run(ctx)
		return tuiDone{id: id, text: text, err: err}
	}
}

// Row formats, 78 columns with the cursor mark: an 80x24 terminal fits.
const (
	sbRow = "%-16s %-10s %-9s %-8s %4s %5s %-11s %4s"
	// sbRowNode is sbRow with a NODE column, for a daemon of a cluster
	// (the list has sandboxes of every node): the name and image give
	// it room, within 80 columns.
	sbRowNode = "%-16s %-8s %-9s %-6s %-6s %4s %5s %-11s %4s"
	snapRow   = "%-16s %-12s %-8s %-8s %4s %9s %7s"
)

func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

func (m *tuiModel) View() tea.View {
	w, h := max(m.width, 20), max(m.height, 6)
	var lines []string
	add := func(s string) { lines = append(lines, fit(s, w)) }

	title := "clade · " + count(len(m.sandboxes), "sandbox", "sandboxes") + " · " + count(len(m.snapshots), "snapshot", "snapshots")
	if m.loaded {
		title += " · updated " + m.lastOK.Format("15:04:05")
	}
	if m.loaded && m.unreachable == nil {
		if m.live {
			title += " · live"
		} else {
			title += " · events lost, polling"
		}
	}
	add(title)
	if m.unreachable != nil {
		add("")
		for _, l := range wrap("DAEMON UNREACHABLE: "+m.unreachable.Error(), w) {
			add(l)
		}
		if m.loaded {
			add(fmt.Sprintf("(showing what it said %s ago; retrying every %s)", time.Since(m.lastOK).Round(time.Second), m.interval))
		} else {
			add(fmt.Sprintf("start it with `clade daemon`, or point --host / CLADE_HOST at it; retrying every %s", m.interval))
		}
	}
	if m.help {
		for _, l := range []string{"",
			"sandboxes view:", "  ↑/↓ j/k  move        s  sleep          w  wake",
			"  e/enter  a shell in it (bash if it has it; exit returns here)",
			"  p        snapshot    f  fork N children (type N, enter)",
			"  d        remove (asks y/n)                   tab  snapshots view",
			"snapshots view:", "  f  fork N children   d  remove (asks y/n)   tab  sandboxes view",
			"anywhere:", "  r  refresh now   ?  this help   q  quit", "", "press any key"} {
			add(l)
		}
		return tuiView(strings.Join(pad(lines, h), "\n"))
	}
	var header string
	var rows []string
	if m.snapView {
		header = fmt.Sprintf(snapRow, "SNAPSHOT", "NAME", "SANDBOX", "IMAGE", "AGE", "SIZE", "USED BY")
		for _, s := range m.snapshots {
			name := s.Name
			if s.Implicit {
				name = "(implicit)"
			}
			rows = append(rows, fmt.Sprintf(snapRow, s.ID, clip(name, 12), short(s.Sandbox), clip(s.Image, 8),
				age(s.CreatedAt), humanBytes(uint64(s.SizeBytes)), fmt.Sprint(len(s.UsedBy))))
		}
	} else {
		clustered := slices.ContainsFunc(m.sandboxes, func(s sdk.Sandbox) bool { return s.Node != "" && s.Node != "local" })
		header = fmt.Sprintf(sbRow, "ID", "NAME", "STATE", "IMAGE", "AGE", "CPU%", "MEM/LIMIT", "PIDS")
		if clustered {
			header = fmt.Sprintf(sbRowNode, "ID", "NAME", "STATE", "NODE", "IMAGE", "AGE", "CPU%", "MEM/LIMIT", "PIDS")
		}
		for _, s := range m.sandboxes {
			state := s.State
			if b := m.busy[s.ID]; b != "" {
				state = b + "…"
			}
			cpu, mem, pids := "", "", ""
			if st, ok := m.stats[s.ID]; ok && st.State == "running" && st.MemoryBytes > 0 {
				if p, ok := m.cpu[s.ID]; ok {
					cpu = fmt.Sprintf("%.1f", p)
				}
				mem = compactBytes(st.MemoryBytes) + "/" + compactBytes(st.MemoryLimitBytes)
				pids = fmt.Sprint(st.Pids)
			}
			if clustered {
				rows = append(rows, fmt.Sprintf(sbRowNode, s.ID, clip(s.Name, 8), clip(state, 9), clip(s.Node, 6), clip(s.Image, 6),
					age(s.CreatedAt), cpu, mem, pids))
				continue
			}
			rows = append(rows, fmt.Sprintf(sbRow, s.ID, clip(s.Name, 10), clip(state, 9), clip(s.Image, 8),
				age(s.CreatedAt), cpu, mem, pids))
		}
	}
	add("")
	add("  " + header)
	// What is left for rows: the title, a blank, the header, and at the
	// bottom the status and the keys.
	room := h - len(lines) - 2
	if len(rows) == 0 && m.loaded {
		if m.snapView {
			rows = append(rows, "  no snapshots (p in the sandboxes view takes one)")
		} else {
			rows = append(rows, "  no sandboxes (clade create makes one)")
		}
	}
	start := 0
	if m.cursor >= room {
		start = m.cursor - room + 1
	}
	for i := start; i < len(rows) && i < start+room; i++ {
		marker := "  "
		if i == m.cursor && len(m.ids()) > 0 {
			marker = "> "
		}
		add(marker + rows[i])
	}
	lines = pad(lines, h-2)
	status := m.status
	if m.forking {
		status = fmt.Sprintf("fork %s into how many children? %s_  (enter starts, other keys cancel)", short(m.selected), m.forkN)
	}
	lines = append(lines, fit(status, w))
	keys := "e shell  s sleep  w wake  p snapshot  f fork  d remove  tab snapshots  q quit"
	if m.snapView {
		keys = "↑↓ move  f fork  d remove  tab sandboxes  ? help  q quit"
	}
	lines = append(lines, fit(keys, w))
	return tuiView(strings.Join(lines, "\n"))
}

// tuiView is the screen with content, on the alternate screen so the
// shell's scrollback is left as it was.
func tuiView(content string) tea.View {
	v := tea.NewView(content)
	v.AltScreen = true
	return v
}

// fit cuts s to w columns (runes: the table is ASCII but for a few marks).
func fit(s string, w int) string {
	if utf8.RuneCountInString(s) <= w {
		return s
	}
	r := []rune(s)
	return string(r[:w-1]) + "…"
}

// wrap breaks s into lines of at most w columns at spaces.
func wrap(s string, w int) []string {
	var out []string
	line := ""
	for _, word := range strings.Fields(s) {
		if line != "" && utf8.RuneCountInString(line)+1+utf8.RuneCountInString(word) > w {
			out = append(out, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	return append(out, line)
}

func clip(s string, n int) string {
	if s == "" {
		return "-"
	}
	return fit(s, n)
}

func pad(lines []string, h int) []string {
	for len(lines) < h {
		lines = append(lines, "")
	}
	return lines
}

func age(t time.Time) string {
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// compactBytes is humanBytes for a narrow column: 17M, 1.5G.
func compactBytes(n uint64) string {
	switch {
	case n >= 10<<30:
		return fmt.Sprintf("%dG", n>>30)
	case n >= 1<<30:
		return fmt.Sprintf("%.1fG", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%dM", n>>20)
	}
	return fmt.Sprintf("%dK", n>>10)
}

// count is "1 sandbox", "2 sandboxes".
func count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}
