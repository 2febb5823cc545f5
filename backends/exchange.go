package backends

import (
	"context"
	"errors"

	"github.com/valyala/fasthttp"
)

// Exchange sends req to the replica over a connection of its proxy client's
// pool, with the same head checks and read timeouts as Client().Do, and
// reads the whole answer into resp, whose body may be at most maxBody
// bytes (fasthttp.ErrBodyTooLarge past it). Unlike Do it can be called
// off: once ctx is done the connection in use is closed, which ends the
// request on the replica as a client leaving does, and Exchange returns
// ctx's error. A connection is kept for reuse only after a whole answer
// that does not close it.
func (r *Replica) Exchange(ctx context.Context, req *fasthttp.Request, resp *fasthttp.Response, maxBody int) error {
	hc := r.client
	req.URI().DisablePathNormalizing = true // as the client's DisablePathNormalizing
	resp.Header.DisableNormalizing()
	for range 1 + staleRetries {
		if err := ctx.Err(); err != nil {
			return err
		}
		cc, err := hc.AcquireConn(0, false)
		if err != nil {
			return err
		}
		conn := cc.Conn()
		stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
		bw := hc.AcquireWriter(conn)
		err = req.Write(bw)
		if err == nil {
			err = bw.Flush()
		}
		hc.ReleaseWriter(bw)
		if err == nil {
			br := hc.AcquireReader(conn)
			err = resp.ReadLimitBody(br, maxBody)
			hc.ReleaseReader(br)
		}
		closed := !stop()
		switch {
		case closed:
			hc.CloseConn(cc)
			return ctx.Err()
		case errors.Is(err, errStaleConn):
			// Nothing was sent on it (strayGuard): another connection.
			hc.CloseConn(cc)
			continue
		case err != nil || resp.ConnectionClose() || req.ConnectionClose():
			hc.CloseConn(cc)
		default:
			hc.ReleaseConn(cc)
		}
		return err
	}
	return errStaleConn
}
