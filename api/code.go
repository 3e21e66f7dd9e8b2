package api

// RunCodeRequest is the body of POST /v1/sandboxes/{id}/code: code run in
// the sandbox's code interpreter (the code-interpreter image). The answer
// is newline-delimited JSON, one CodeEvent a line, as the run goes.
type RunCodeRequest struct {
	Code string `json:"code"`
	// Language picks the language's default context (python, bash, js;
	// python if empty); Context names a context instead (not both).
	Language string            `json:"language,omitempty"`
	Context  string            `json:"context,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	// TimeoutMS interrupts the run after this long (the context lives on,
	// unless its kernel is not back within 5 s of the interrupt: then it
	// is restarted and its state lost).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
}

// CodeEvent is one line of a run's answer: type stdout or stderr (Text),
// result (a MIME bundle: text, html, png... as E2B names them, and
// IsMainResult), error (Name, Value, Traceback), number_of_executions
// (ExecutionCount) and, last, end_of_execution.
type CodeEvent struct {
	Type           string `json:"type"`
	Text           string `json:"text,omitempty"`
	Timestamp      int64  `json:"timestamp,omitempty"`
	IsMainResult   bool   `json:"is_main_result,omitempty"`
	HTML           string `json:"html,omitempty"`
	Markdown       string `json:"markdown,omitempty"`
	SVG            string `json:"svg,omitempty"`
	PNG            string `json:"png,omitempty"` // base64
	JPEG           string `json:"jpeg,omitempty"`
	PDF            string `json:"pdf,omitempty"`
	LaTeX          string `json:"latex,omitempty"`
	JSON           string `json:"json,omitempty"`
	JavaScript     string `json:"javascript,omitempty"`
	Name           string `json:"name,omitempty"`
	Value          string `json:"value,omitempty"`
	Traceback      string `json:"traceback,omitempty"`
	ExecutionCount int    `json:"execution_count,omitempty"`
}

// CodeContext is a context of a sandbox's code interpreter: one kernel,
// its state kept between runs.
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// CreateCodeContextRequest is the body of POST
// /v1/sandboxes/{id}/code/contexts.
type CreateCodeContextRequest struct {
	Language string `json:"language,omitempty"`
	Cwd      string `json:"cwd,omitempty"`
}
