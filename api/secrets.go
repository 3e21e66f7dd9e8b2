package api

import "time"

// Secret is a secret's name, version and dates; the API never returns a
// secret's value.
type Secret struct {
	Name string `json:"name"`
	// Version counts the values set; sandboxes made from now on get this one.
	Version   int       `json:"version"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// UsedBy lists the sandboxes that took the secret (any version).
	UsedBy []string `json:"used_by,omitempty"`
}

// MaxSecretBytes bounds a secret's value.
const MaxSecretBytes = 64 << 10

// SetSecretRequest is the body of PUT /v1/secrets/{name}.
type SetSecretRequest struct {
	// Value is the secret (base64 in JSON), at most 64 KiB.
	Value []byte `json:"value"`
}

// SecretRef is a secret a sandbox takes: into an environment variable
// (Env, by default the secret's name) or a file under /run/secrets, a
// tmpfs inside the sandbox (File).
type SecretRef struct {
	Name string `json:"name"`
	Env  string `json:"env,omitempty"`
	File string `json:"file,omitempty"`
	// Version (in responses) is the version the sandbox has.
	Version int `json:"version,omitempty"`
}
