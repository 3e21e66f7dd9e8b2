package ingress

import (
	"net/http"
	"strconv"
	"testing"
	"time"
)

// Another sandbox under the same domain can set a clade-signed cookie for
// the whole domain (Set-Cookie with Domain=the ingress domain), which the
// browser then sends before the sandbox's own: the good one still passes.
func TestSignedCookieTossed(t *testing.T) {
	now := time.Now()
	exp := now.Add(time.Minute).Unix()
	good := strconv.FormatInt(exp, 10) + "." + Sign("tok", "id", 80, exp)
	for _, cookies := range []string{
		CookieName + "=1.bad; " + CookieName + "=" + good,
		CookieName + "=junk; app=1; " + CookieName + "=" + good,
		CookieName + "=" + good,
	} {
		r, _ := http.NewRequest("GET", "http://80-id.test/", nil)
		r.Header.Set("Cookie", cookies)
		if v, _, from := checkSigned(r, "tok", "id", 80, now); v != signedOK || from != "cookie" {
			t.Errorf("%s: verdict %d from %q, want a pass from the cookie", cookies, v, from)
		}
	}
	r, _ := http.NewRequest("GET", "http://80-id.test/", nil)
	r.Header.Set("Cookie", CookieName+"=1.bad; "+CookieName+"=2.worse")
	if v, _, _ := checkSigned(r, "tok", "id", 80, now); v != signedBad {
		t.Errorf("two bad cookies: verdict %d, want bad", v)
	}
}
