package local

// SetCallHook makes f the service's call hook (callHook) until the
// returned func is called.
func SetCallHook(f func(point, ref string)) (reset func()) {
	callHook = f
	return func() { callHook = nil }
}
