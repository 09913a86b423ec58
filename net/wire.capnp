# net/wire.capnp — every message between actors of different processes.
#
# A message on the wire = one frame holding an Envelope (this schema, flat
# array encoding, unpacked) followed by one raw frame per tensor, in the
# order of Envelope.tensors. See docs/protocol.md.
@0xc0f1a7e3b2d94e61;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("corolla::wire");

enum MessageKind {
  hello @0;
  helloAck @1;
  helloReject @2;
  heartbeat @3;
  heartbeatAck @4;
  request @5;
  response @6;
  error @7;
  oneway @8;
  goodbye @9;
}

enum DType {
  f32 @0;
  bf16 @1;
  f16 @2;
  i32 @3;
  i8 @4;
}

enum TensorEncoding {
  raw @0;        # the tensor's bytes in its dtype
  int8Block @1;  # f32 scales (ceil(n / blockSize)) then int8 values (n)
}

struct TensorHeader {
  dtype @0 :DType;             # dtype of the tensor the receiver reconstructs
  shape @1 :List(Int64);
  byteSize @2 :UInt64;         # exact size of the tensor's frame
  encoding @3 :TensorEncoding;
  blockSize @4 :UInt32;        # int8Block only
  checksum @5 :UInt64;         # XXH3-64 of the frame; 0 = not computed
}

struct Envelope {
  kind @0 :MessageKind;
  senderNode @1 :Text;
  senderActor @2 :Text;
  targetActor @3 :Text;
  correlationId @4 :UInt64;
  type @5 :Text;               # application message type
  body @6 :Data;               # application body (a Cap'n Proto message), small
  tensors @7 :List(TensorHeader);
  sentAtNs @8 :UInt64;
  errorCode @9 :Text;
  errorMessage @10 :Text;
}

# Body of hello / helloAck.
struct Hello {
  protocolVersion @0 :UInt32;
  nodeId @1 :Text;
  listenEndpoint @2 :Text;
  nicClass @3 :Text;
  capabilities @4 :List(Text);
  maxMessageBytes @5 :UInt64;
}

# Body of the runtime's own "echo" request/response (corolla ping).
struct Echo {
  sequence @0 :UInt64;
}
