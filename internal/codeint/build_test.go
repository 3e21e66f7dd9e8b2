package codeint

import (
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
)

func TestBuildImage(t *testing.T) {
	testenv.BuiltinImage(t, Image)
}
