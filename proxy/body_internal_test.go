package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"testing"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/race"
)

// streamedRequest makes ctx's request the one in raw, with its body left
// as a stream, as Server with StreamRequestBody hands it to the handler.
func streamedRequest(t testing.TB, ctx *fasthttp.RequestCtx, br *bufio.Reader, src *bytes.Reader, raw []byte) {
	src.Reset(raw)
	br.Reset(src)
	ctx.Request.Reset()
	if err := ctx.Request.Header.Read(br); err != nil {
		t.Fatal(err)
	}
	if err := ctx.Request.ContinueReadBodyStream(br, 8<<20); err != nil {
		t.Fatal(err)
	}
}

// Reading a body into the pooled buffers allocates nothing once they are
// warm, whatever its size and framing, and hands back all it took.
func TestReadBodyAllocations(t *testing.T) {
	p := New(nil, nil, nil, zap.NewNop(), Options{})
	opts := p.live.Load()
	var ctx fasthttp.RequestCtx
	br := bufio.NewReaderSize(nil, 32<<10)
	var src bytes.Reader
	for _, size := range []int{300, 8 << 10, 40 << 10, 1 << 20} {
		body := bytes.Repeat([]byte("x"), size)
		for _, chunked := range []bool{false, true} {
			var raw []byte
			if chunked {
				raw = []byte("POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
				for i := 0; i < size; i += 5000 {
					part := body[i:min(i+5000, size)]
					raw = append(raw, fmt.Sprintf("%x\r\n", len(part))...)
					raw = append(append(raw, part...), "\r\n"...)
				}
				raw = append(raw, "0\r\n\r\n"...)
			} else {
				raw = append([]byte(fmt.Sprintf("POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", size)), body...)
			}
			name := fmt.Sprintf("%d chunked=%v", size, chunked)
			read := func() {
				streamedRequest(t, &ctx, br, &src, raw)
				bb, e := p.readBody(&ctx, opts)
				if e != nil {
					t.Fatalf("%s: %s", name, e.Body())
				}
				if !bytes.Equal(ctx.Request.Body(), body) {
					t.Fatalf("%s: body read differs", name)
				}
				p.releaseBody(&ctx, bb)
			}
			setup := func() {
				streamedRequest(t, &ctx, br, &src, raw)
				ctx.Request.SetBodyRaw(nil)
			}
			read()
			extra := testing.AllocsPerRun(20, read) - testing.AllocsPerRun(20, setup)
			if budget := 0.0; extra > budget && !race.Enabled {
				t.Errorf("%s: readBody allocates %.1f times per body warm, want %v", name, extra, budget)
			}
			if n := p.BodyBufferBytes(); n != 0 {
				t.Errorf("%s: %d bytes of body budget not handed back", name, n)
			}
		}
	}
}

// bodyClass and the buffers' capacities agree: class c holds 4 KiB << c.
func TestBodyClass(t *testing.T) {
	for _, c := range []struct{ n, class int }{{0, 0}, {1, 0}, {4096, 0}, {4097, 1}, {8192, 1}, {8193, 2}, {1 << 20, 8}, {1<<20 + 1, 9}} {
		if got := bodyClass(c.n); got != c.class {
			t.Errorf("bodyClass(%d) = %d, want %d", c.n, got, c.class)
		}
	}
	p := New(nil, nil, nil, zap.NewNop(), Options{})
	bb := p.takeBodyBuf(3, 1<<30)
	if cap(bb.b) != 32<<10 || p.BodyBufferBytes() != 32<<10 {
		t.Errorf("class 3: cap %d, counted %d; want 32 KiB", cap(bb.b), p.BodyBufferBytes())
	}
	if p.takeBodyBuf(3, 40<<10) != nil {
		t.Error("a second 32 KiB buffer was taken within a 40 KiB budget")
	}
	p.giveBodyBuf(bb)
	if p.BodyBufferBytes() != 0 {
		t.Errorf("%d counted after giving back", p.BodyBufferBytes())
	}
}
