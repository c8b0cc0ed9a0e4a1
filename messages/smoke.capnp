@0x8ba2e3bd2f2b15e6;
# Smoke-test protocol: a pinger sends rounds to every ponger, each ponger answers.
# Used by `configs/smoke.toml` to exercise envelopes, topology and failure detection
# without any ML. Ids are stable; evolve by adding fields only.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("sorl::msg");

struct Ping {
  round @0 :UInt64;        # 0-based round number
  sentNs @1 :Int64;        # sender's steady_clock time, nanoseconds
  payload @2 :Data;        # opaque filler, sized by smoke.payload_bytes
}

struct Pong {
  round @0 :UInt64;        # the round this answers
  ponger @1 :Text;         # "<role>#<index>@<node>"
  received @2 :UInt64;     # pings this ponger has received so far
  payloadBytes @3 :UInt64; # size of the payload it saw, bytes
  sentNs @4 :Int64;        # echoed from the Ping, nanoseconds
}
