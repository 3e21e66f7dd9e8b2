// Package errdefs holds clade's error classes. Every layer wraps its errors
// with one of these classes so the daemon can map them to HTTP status codes in
// exactly one place and the SDK can map them back.
package errdefs

import (
	"errors"
	"fmt"
	"net/http"
)

// Class is a category of error that callers can act on.
type Class string

const (
	NotFound          Class = "not_found"
	AlreadyExists     Class = "already_exists"
	InvalidArgument   Class = "invalid_argument"
	Conflict          Class = "conflict"
	Unavailable       Class = "unavailable" // retryable: try again later
	ResourceExhausted Class = "resource_exhausted"
	Unauthenticated   Class = "unauthenticated"
	Internal          Class = "internal"
)

type classed struct {
	class Class
	err   error
}

func (e *classed) Error() string { return e.err.Error() }
func (e *classed) Unwrap() error { return e.err }

// New returns an error of class c with a formatted message.
func New(c Class, format string, args ...any) error {
	return &classed{class: c, err: fmt.Errorf(format, args...)}
}

// Wrap marks err as class c. A nil err stays nil.
func Wrap(c Class, err error) error {
	if err == nil {
		return nil
	}
	return &classed{class: c, err: err}
}

// ClassOf returns the class of the outermost classed error in err's chain, or
// Internal when there is none.
func ClassOf(err error) Class {
	var ce *classed
	if errors.As(err, &ce) {
		return ce.class
	}
	return Internal
}

// Is reports whether err is of class c.
func Is(err error, c Class) bool { return err != nil && ClassOf(err) == c }

func IsNotFound(err error) bool        { return Is(err, NotFound) }
func IsAlreadyExists(err error) bool   { return Is(err, AlreadyExists) }
func IsInvalidArgument(err error) bool { return Is(err, InvalidArgument) }
func IsConflict(err error) bool        { return Is(err, Conflict) }
func IsUnavailable(err error) bool     { return Is(err, Unavailable) }

// HTTPStatus is the one mapping from error classes to HTTP status codes,
// shared by every HTTP front.
func HTTPStatus(c Class) int {
	switch c {
	case NotFound:
		return http.StatusNotFound
	case AlreadyExists, Conflict:
		return http.StatusConflict
	case InvalidArgument:
		return http.StatusBadRequest
	case Unavailable:
		return http.StatusServiceUnavailable
	case ResourceExhausted:
		return http.StatusTooManyRequests
	case Unauthenticated:
		return http.StatusUnauthorized
	}
	return http.StatusInternalServerError
}
