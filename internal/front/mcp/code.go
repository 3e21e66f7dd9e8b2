package mcp

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/sdk"
	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

type RunCodeInput struct {
	Sandbox        string            `json:"sandbox" jsonschema:"the sandbox's id or name; it must be of the code-interpreter image (create_sandbox with image code-interpreter)"`
	Code           string            `json:"code" jsonschema:"the code to run; variables are kept between calls in the same context"`
	Language       string            `json:"language,omitempty" jsonschema:"python (default), bash or js"`
	Context        string            `json:"context,omitempty" jsonschema:"a context id, instead of the language's default context"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables for this run only"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty" jsonschema:"interrupt the run after this many seconds (the context keeps its state, unless its kernel ignores the interrupt for 5 s more: then it is restarted and its state lost); default 120, at most 3600"`
}

type RunCodeOutput struct {
	Stdout         string   `json:"stdout"`
	Stderr         string   `json:"stderr"`
	Result         string   `json:"result,omitempty" jsonschema:"the text of the value of the last expression"`
	Results        []string `json:"results,omitempty" jsonschema:"the text of every rich result (figures come as image content)"`
	Error          string   `json:"error,omitempty" jsonschema:"the exception, with its traceback"`
	ExecutionCount int      `json:"execution_count,omitempty"`
}

func (t *tools) registerCode(s *mcpsdk.Server) {
	add(s, t.cfg.Log, &mcpsdk.Tool{Name: "run_code", Title: "Run code in a sandbox's interpreter",
		Description: "Run Python (or bash, or JavaScript) in a stateful interpreter in a sandbox of the code-interpreter image, like a Jupyter cell: variables, imports and loaded data are kept between calls. Returns stdout, stderr, the value of the last expression, and charts (matplotlib figures) as images. numpy, pandas, matplotlib and scipy are installed.",
		Annotations: &mcpsdk.ToolAnnotations{DestructiveHint: boolPtr(true), OpenWorldHint: boolPtr(true)}}, t.runCode)
}

func (t *tools) runCode(ctx context.Context, in RunCodeInput) (*mcpsdk.CallToolResult, RunCodeOutput, error) {
	if strings.TrimSpace(in.Code) == "" {
		return nil, RunCodeOutput{}, errors.New("nothing to run: give code")
	}
	timeout := in.TimeoutSeconds
	switch {
	case timeout == 0:
		timeout = 120
	case timeout < 0 || timeout > 3600:
		return nil, RunCodeOutput{}, fmt.Errorf("timeout_seconds %d is out of range: give 1 to 3600", timeout)
	}
	ex, err := t.c.RunCode(ctx, in.Sandbox, sdk.RunCodeRequest{Code: in.Code, Language: in.Language, Context: in.Context, Env: in.Env,
		TimeoutMS: (time.Duration(timeout) * time.Second).Milliseconds()}, nil)
	if err != nil {
		return nil, RunCodeOutput{}, err
	}
	stdout, stderr := newCapped(t.cfg.MaxOutput), newCapped(t.cfg.MaxOutput)
	stdout.Write([]byte(strings.Join(ex.Stdout, "")))
	stderr.Write([]byte(strings.Join(ex.Stderr, "")))
	out := RunCodeOutput{Stdout: stdout.String(), Stderr: stderr.String(), Result: ex.Text(), ExecutionCount: ex.ExecutionCount}
	var content []mcpsdk.Content
	for _, r := range ex.Results {
		if !r.IsMainResult && r.Text != "" {
			out.Results = append(out.Results, r.Text)
		}
		for _, img := range []struct{ data, mime string }{{r.PNG, "image/png"}, {r.JPEG, "image/jpeg"}} {
			if img.data == "" {
				continue
			}
			if b, err := base64.StdEncoding.DecodeString(img.data); err == nil {
				content = append(content, &mcpsdk.ImageContent{Data: b, MIMEType: img.mime})
			}
		}
	}
	if ex.Error != nil {
		out.Error = ex.Error.Name + ": " + ex.Error.Value
		if ex.Error.Traceback != "" {
			out.Error += "\n" + stripANSI(ex.Error.Traceback)
		}
	}
	var b strings.Builder
	if out.Stdout != "" {
		fmt.Fprintf(&b, "stdout:\n%s\n", out.Stdout)
	}
	if out.Stderr != "" {
		fmt.Fprintf(&b, "stderr:\n%s\n", out.Stderr)
	}
	if out.Result != "" {
		fmt.Fprintf(&b, "result:\n%s\n", out.Result)
	}
	if out.Error != "" {
		fmt.Fprintf(&b, "error:\n%s\n", out.Error)
	}
	if b.Len() == 0 {
		b.WriteString("(no output)")
	}
	content = append([]mcpsdk.Content{&mcpsdk.TextContent{Text: b.String()}}, content...)
	return &mcpsdk.CallToolResult{Content: content}, out, nil
}

// stripANSI removes terminal colour sequences (IPython colours its
// tracebacks).
func stripANSI(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 0x1b && i+1 < len(s) && s[i+1] == '[' {
			j := i + 2
			for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e) {
				j++
			}
			i = j
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
