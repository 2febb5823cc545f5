// Package flow is kvroute's flow control at the gateway: limits per
// tenant (a request rate with a burst, as nginx's limit_req; concurrent
// requests, as limit_conn; prompt tokens per minute), and the queue that
// holds requests while every replica that could serve them is saturated,
// strict between priority bands and fair between the flows (tenants) of a
// band, dispatched as capacity frees so that each is routed late, with
// the cache and load of the moment.
//
// It knows nothing of HTTP or of the fleet: the proxy names the tenant,
// the priority and the prompt's size, and tells the queue when a request
// may be dispatched.
package flow
