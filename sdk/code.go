package sdk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/clade-sandbox/clade/api"
)

type (
	RunCodeRequest           = api.RunCodeRequest
	CodeEvent                = api.CodeEvent
	CodeContext              = api.CodeContext
	CreateCodeContextRequest = api.CreateCodeContextRequest
)

// Execution is what a run of code produced, in order.
type Execution struct {
	Stdout, Stderr []string
	// Results are the rich results (MIME bundles); the main one, the
	// value of the cell's last expression, has IsMainResult.
	Results []CodeEvent
	// Error is set when the code raised (or timed out, or its kernel
	// died).
	Error          *CodeEvent
	ExecutionCount int
	// Truncated says that output or results past what RunCode keeps
	// (MaxKeptOutput, MaxKeptResults) were dropped: a server of clade's
	// sends less, one that is not (what answers on the port is the
	// sandbox's) must not fill the caller's memory. onEvent saw them all.
	Truncated bool
}

// What RunCode keeps of a run: twice what clade's server sends at most
// (8 MiB of stdout and stderr, 32 MiB of results).
const (
	MaxKeptOutput  = 16 << 20
	MaxKeptResults = 64 << 20
)

// Text is the text of the main result, "" if none.
func (e *Execution) Text() string {
	for _, r := range e.Results {
		if r.IsMainResult {
			return r.Text
		}
	}
	return ""
}

// RunCode runs code in the sandbox's code interpreter (a sandbox of the
// code-interpreter image), keeping state per context. onEvent, if set, is
// called with each event as it arrives (stdout lines before the run ends).
func (c *Client) RunCode(ctx context.Context, ref string, req RunCodeRequest, onEvent func(CodeEvent)) (*Execution, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	hr, err := c.newRequest(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(ref)+"/code", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := c.do(hr)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	ex := &Execution{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 128<<20)
	ended := false
	kept, keptResults := 0, 0
	for sc.Scan() {
		var ev CodeEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return ex, fmt.Errorf("code interpreter: bad event line: %w", err)
		}
		switch ev.Type {
		case "stdout", "stderr":
			if kept += len(ev.Text); kept > MaxKeptOutput {
				ex.Truncated = true
			} else if ev.Type == "stdout" {
				ex.Stdout = append(ex.Stdout, ev.Text)
			} else {
				ex.Stderr = append(ex.Stderr, ev.Text)
			}
		case "result":
			if keptResults += len(sc.Bytes()); keptResults > MaxKeptResults {
				ex.Truncated = true
			} else {
				ex.Results = append(ex.Results, ev)
			}
		case "error":
			e := ev
			ex.Error = &e
		case "number_of_executions":
			ex.ExecutionCount = ev.ExecutionCount
		case "end_of_execution":
			ended = true
		}
		if onEvent != nil {
			onEvent(ev)
		}
	}
	if err := sc.Err(); err != nil {
		return ex, err
	}
	if !ended {
		return ex, fmt.Errorf("code interpreter: the run's answer was cut short")
	}
	return ex, nil
}

// CodeContexts lists the sandbox's code contexts.
func (c *Client) CodeContexts(ctx context.Context, ref string) ([]CodeContext, error) {
	var out []CodeContext
	return out, c.call(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(ref)+"/code/contexts", nil, &out)
}

// CreateCodeContext starts a new context (kernel) in the sandbox.
func (c *Client) CreateCodeContext(ctx context.Context, ref string, req CreateCodeContextRequest) (CodeContext, error) {
	var out CodeContext
	return out, c.call(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(ref)+"/code/contexts", req, &out)
}

// RestartCodeContext restarts a context's kernel: its state is cleared.
func (c *Client) RestartCodeContext(ctx context.Context, ref, id string) error {
	return c.call(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(ref)+"/code/contexts/"+url.PathEscape(id)+"/restart", nil, nil)
}

// RemoveCodeContext stops a context's kernel.
func (c *Client) RemoveCodeContext(ctx context.Context, ref, id string) error {
	return c.call(ctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(ref)+"/code/contexts/"+url.PathEscape(id), nil, nil)
}
