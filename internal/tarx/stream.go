package tarx

import (
	"archive/tar"
	"io"
)

// Stream returns the archive fill writes, made as it is read: fill runs in
// its own goroutine, and its error (or the archive's close) ends the
// stream. Closing the reader early makes fill's next write fail.
func Stream(fill func(*tar.Writer) error) *io.PipeReader {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := fill(tw)
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr
}
