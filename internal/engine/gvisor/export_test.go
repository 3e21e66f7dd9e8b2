package gvisor

// FakeProcessEnv makes the test binary block until killed, so that a test
// can start a process with any command line (a stand-in for runsc's).
const FakeProcessEnv = "CLADE_TEST_FAKE_RUNSC"
