package ingress

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// A signed URL lets a browser (or anything that cannot set a header) reach
// one port of a sandbox until a deadline, without the sandbox's traffic
// token: the URL carries the deadline and an HMAC-SHA256 of the sandbox id,
// the port and the deadline, keyed by the traffic token. The first request
// that carries them gets a cookie with the same pair, scoped to that
// port's host, so the page's further requests (its scripts, images) pass
// too. Nothing is stored: the token is the key, so a signed URL is
// worthless for any other sandbox or port, and after its deadline.

// Query parameters and cookie of a signed URL.
const (
	ExpiresParam   = "clade-expires"
	SignatureParam = "clade-signature"
	CookieName     = "clade-signed"
)

// Sign returns the signature of a signed URL for port of sandbox id until
// exp (unix seconds), keyed by the sandbox's traffic token.
func Sign(token, id string, port int, exp int64) string {
	mac := hmac.New(sha256.New, []byte(token))
	mac.Write([]byte("clade-signed-url\x00" + id + "\x00" + strconv.Itoa(port) + "\x00" + strconv.FormatInt(exp, 10)))
	return hex.EncodeToString(mac.Sum(nil))
}

// SignURL adds a signature valid until exp to base (the port's URL).
func SignURL(base, token, id string, port int, exp time.Time) string {
	q := url.Values{}
	q.Set(ExpiresParam, strconv.FormatInt(exp.Unix(), 10))
	q.Set(SignatureParam, Sign(token, id, port, exp.Unix()))
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	return base + sep + q.Encode()
}

// signedVerdict is what a request's signature says.
type signedVerdict int

const (
	unsigned signedVerdict = iota // no signature: the token header decides
	signedOK
	signedExpired
	signedBad
)

// checkSigned looks for a signature in r's query, then in its cookies; from
// says which held it ("query" or "cookie"). Every cookie of the name is
// tried: another sandbox under the same domain can set one for the whole
// domain, which the browser may send first.
func checkSigned(r *http.Request, token, id string, port int, now time.Time) (v signedVerdict, exp int64, from string) {
	q := r.URL.Query()
	es, sig := q.Get(ExpiresParam), q.Get(SignatureParam)
	if es != "" || sig != "" {
		v, exp = verifySigned(es, sig, token, id, port, now)
		return v, exp, "query"
	}
	cs := r.CookiesNamed(CookieName)
	if len(cs) == 0 {
		return unsigned, 0, ""
	}
	v = signedBad
	for _, c := range cs {
		es, sig, ok := strings.Cut(c.Value, ".")
		if !ok {
			continue
		}
		switch cv, cexp := verifySigned(es, sig, token, id, port, now); cv {
		case signedOK:
			return signedOK, cexp, "cookie"
		case signedExpired:
			v, exp = signedExpired, cexp
		}
	}
	return v, exp, "cookie"
}

// verifySigned checks a deadline and signature for port of sandbox id.
func verifySigned(es, sig, token, id string, port int, now time.Time) (signedVerdict, int64) {
	exp, err := strconv.ParseInt(es, 10, 64)
	if err != nil || token == "" || !hmac.Equal([]byte(sig), []byte(Sign(token, id, port, exp))) {
		return signedBad, 0
	}
	if now.Unix() >= exp {
		return signedExpired, exp
	}
	return signedOK, exp
}

// stripSigned removes a signed URL's parameters from u, so that the
// application sees the URL it would without them.
func stripSigned(u *url.URL) {
	if u.RawQuery == "" {
		return
	}
	q := u.Query()
	if !q.Has(ExpiresParam) && !q.Has(SignatureParam) {
		return
	}
	q.Del(ExpiresParam)
	q.Del(SignatureParam)
	u.RawQuery = q.Encode()
}

// stripReferer removes a signed URL's parameters from a request's Referer:
// a page loaded from a signed URL sends that URL with its further requests.
func stripReferer(h http.Header) {
	ref := h.Get("Referer")
	if !strings.Contains(ref, SignatureParam) && !strings.Contains(ref, ExpiresParam) {
		return
	}
	u, err := url.Parse(ref)
	if err != nil {
		h.Del("Referer")
		return
	}
	stripSigned(u)
	h.Set("Referer", u.String())
}
