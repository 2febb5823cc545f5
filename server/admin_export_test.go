package server

// LoopbackAddr exposes loopbackAddr to the external tests.
var LoopbackAddr = loopbackAddr
