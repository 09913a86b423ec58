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
  # Relaying (docs/protocol.md, "Relays"): a message a node asks a relay to
  # pass on names the final node in relayTo; the relay sends it on with
  # relayTo cleared and relayFrom set to the node it came from.
  relayTo @11 :Text;
  relayFrom @12 :Text;
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

# ---- swarm serving (actors/span_server.hpp) ---------------------------------
# Bodies of the requests a client sends to a server's "span" actor. Hidden
# states travel as tensor frames: [n, D] float rows.

# Answer to "span.info" (and to "span.open", with the cache left after it).
struct SpanInfo {
  model @0 :Text;            # model id the server announces (its directory name)
  first @1 :Int32;           # blocks [first, last) of nBlocks
  last @2 :Int32;
  nBlocks @3 :Int32;
  hiddenSize @4 :Int32;
  maxPositions @5 :Int64;    # the model's context
  cacheTokens @6 :Int64;     # KV budget in tokens
  cacheTokensLeft @7 :Int64; # tokens a new session can count on
  stepSPerBlock @8 :Float64; # measured seconds per block of a one-row step; 0 = not measured
  sessions @9 :UInt32;       # open sessions
  rtts @10 :List(PeerRtt);   # RTTs the server measured to servers of the block after its span
  draining @11 :Bool;        # shutting down: open sessions go on, new ones are refused
  awaitingPushes @12 :UInt32; # steps waiting for a push from the previous server
  weights @13 :Text;         # dtype of the linear weights its decode reads ("f32", "bf16", "i8"); "" from older servers
  sharedTokens @14 :Int64;   # answer to span.open with shareFrom: the tokens the new session
                             # starts with (0: nothing shared; its first step starts there)
  adapters @15 :List(Text);  # names of the LoRA adapters it serves (SpanOpen.adapter); at most 64
  adapterDigests @16 :List(Text); # their fingerprints (16 hex digits), in the same order
}

# One measured round-trip time to another node.
struct PeerRtt {
  node @0 :Text;             # its node id
  ms @1 :Float64;            # moving average, milliseconds
}

# "span.open": an inference session for positions [0, maxLength).
struct SpanOpen {
  sessionId @0 :Text;
  maxLength @1 :Int64;
  first @2 :Int32 = -1;      # blocks [first, last) of the server's span the
  last @3 :Int32 = -1;       # session runs; -1 = the span's own bound
  deepPrompts @4 :Bool;      # tensor 0 = trained deep prompts f32 [blocks, P, D]
                             # for the session's blocks: positions [0, P) are a prefix
  shareFrom @5 :Text;        # another session of the same node on the same blocks whose
  shareTokens @6 :Int64;     # first shareTokens positions had the very inputs this one's
                             # will have: the new session starts on its KV pages (answered:
                             # SpanInfo.sharedTokens, fewer or 0 when it cannot)
  adapter @7 :Text;          # a LoRA adapter of SpanInfo.adapters every step takes ("" = none;
                             # another: the error unknown_adapter)
}

# "span.step": tensor 0 = hidden [n, D] for positions [start, start + n) of
# the session; the answer carries the span's output [n, D] as tensor 0.
struct SpanStep {
  sessionId @0 :Text;
  start @1 :Int64;
  stepId @2 :UInt64;         # 0 = no retry detection
  compressOutput @3 :Bool;   # answer with the output as int8Block (lossy, ~1/4 the bytes)
  # Server-to-server push (docs/protocol.md "Push along the route"):
  awaitPush @4 :Bool;        # no tensor here: the input is pushed by server pushFrom
  pushFrom @5 :Text;         # node id of the previous hop; pushes from others are dropped
  waitMs @6 :UInt32;         # how long to wait for that push before answering an error
  pushTo @7 :PushTarget;     # where to push the output besides answering (unset = nowhere)
  trail @8 :Bool;            # posted route (docs/protocol.md "Posted steps"): the output goes on
                             # (push) and back (answer) followed by the inputs of the route's
                             # hops after the first, in route order
  upstreamProblem @9 :Text;  # span.push only: the sender could not compute this step (why);
                             # no tensor, and the receiver's waiting step fails at once
  owner @10 :Text;           # span.push only: the node whose step this is (it owns the sender's
                             # session); the receiver takes the push only for a step of that node
}

# The next hop of a route, for a server that pushes its output on.
struct PushTarget {
  node @0 :Text;             # node id of the next server
  endpoint @1 :Text;         # where to dial it when no link is up yet
  publicKey @2 :Text;        # its CurveZMQ key ("" = none)
  sessionId @3 :Text;        # the session on the next server
}

# "span.push" (one-way, server -> next server): a SpanStep whose sessionId
# is the receiver's session; tensor 0 = the sender's output [n, D].
# Answer body of "span.step" when pushTo was set.
struct SpanStepDone {
  pushed @0 :Bool;           # the output went on to pushTo
  pushProblem @1 :Text;      # why not, when it did not
}

# "span.close".
struct SpanClose {
  sessionId @0 :Text;
  keep @1 :Bool;             # park it: no more steps, but the server may keep its pages
                             # for this node's later span.open shareFrom until it needs
                             # them (oldest parked first) or the session idles out
}

# "span.forward" (tensors: hidden [B*T, D], optional deep prompts
# [blocks, P, D]) and "span.backward" (tensors: hidden, grad_output [B*T, D],
# optional deep prompts): stateless, for fine-tuning clients.
struct SpanBatch {
  batch @0 :Int32;
  seq @1 :Int32;
  withPrompts @2 :Bool;
  first @3 :Int32 = -1;      # blocks [first, last) of the server's span to run
  last @4 :Int32 = -1;       # (-1 = the span's own bound); prompts cover exactly these
  withMargins @5 :Bool;      # span.forward: also answer each row's routing margin
                             # (f32 [B*T], a second tensor; spot checks of mixtures of experts)
  adapter @6 :Text;          # compute with this LoRA adapter of SpanInfo.adapters merged ("" = none)
  # The client's own LoRA adapter (a fine-tuning client training it through the
  # swarm; not with `adapter`): loraRank > 0 says the request carries it. Its
  # tensors follow the request's others (after the prompts): for each block of
  # [first, last), A [r, in] then B [out, r] of each target, f32. A backward
  # answers their gradients in the same order after its others.
  loraRank @7 :Int32;        # 1 .. 128
  loraAlpha @8 :Float32;
  loraRslora @9 :Bool;       # scale alpha / sqrt(r) instead of alpha / r
  loraTargets @10 :List(Text); # module paths ("self_attn.q_proj"), at most 8
}

# ---- pipeline x data-parallel training (actors/train_*.hpp, docs/protocol.md) ----
# Every training message is one-way (a send, never a request): ranks and the
# coordinator each publish an actor ("train", "train-coord") whose mailbox
# files messages by (type, step, index, hop) until the runtime asks for them.

# "train.join" rank -> coordinator: a rank is up and listening.
struct TrainJoin {
  rank @0 :Int32;
  world @1 :Int32;
  endpoint @2 :Text;       # where the rank's node listens
  jobKey @3 :Text;         # model shape, layout, batch and run settings: ranks of another job are refused
}

# "train.roster" coordinator -> every rank, once all have joined.
struct TrainRoster {
  peers @0 :List(Peer);
  job @1 :UInt64;          # this run's random id: every later message carries it
  struct Peer {
    rank @0 :Int32;
    nodeId @1 :Text;
    endpoint @2 :Text;
  }
}

# "train.act" (tensor 0: activations [rows, D]), "train.grad" (tensor 0:
# their gradient), "train.rs" / "train.ag" (tensor 0: one ring chunk of a
# bucket's gradients / parameters), "train.params" (tensor 0: a bucket's
# parameters or a piece of them, for the final save: `hop` is the ask's),
# "train.paramsask" (no tensor: the coordinator asks for values [lo, hi)
# of bucket `index`; `hop` numbers the asks to a rank from 0).
struct TrainPacket {
  step @0 :Int64;
  index @1 :Int32;         # micro-batch (act, grad) or bucket (rs, ag, params; -1 = the head)
  hop @2 :Int32;           # ring hop (rs, ag); the ask's number at the rank (paramsask, params); 0 otherwise
  from @3 :Int32;          # the sender's rank
  job @4 :UInt64;          # the run's id from the roster (messages of another run are never taken)
  lo @5 :Int64;            # train.paramsask: the first of the bucket's flat values wanted
  hi @6 :Int64;            # train.paramsask: one past the last (the answer carries values [lo, hi))
}

# "train.report" rank -> coordinator after the step's gradients are reduced.
struct TrainReport {
  rank @0 :Int32;
  step @1 :Int64;
  loss @2 :Float64;        # last stages: sum of micro-batch losses x rows / global rows
  sumSquares @3 :Float64;  # squared L2 norm of the gradient shards this rank owns
  job @4 :UInt64;
  links @5 :List(LinkRate); # on probe steps (--probe-every): the rank's links to its higher neighbours
  computeS @6 :Float64;     # seconds of this step inside the stage's forward and backward (0 = not measured: device ranks)
  ringsSideBySide @7 :Int32; # the most of this step's bucket reductions over host rings of 2+ ranks its DP group ran at once (0: none)
  updatesSideBySide @8 :Int32; # the same of the step before's bucket updates (clipping or loss scaling: run after the norm, so after that step's report) (0: none)
  struct LinkRate {
    peer @0 :Int32;         # the neighbour's rank
    bytesPerS @1 :Float64;  # measured with echoes, both ways averaged; 0 = too fast to tell
  }
}

# "train.norm" coordinator -> every rank: the step's global gradient norm.
# "train.saved" rank -> coordinator: its checkpoint shard of `step` is on disk.
# "train.done" rank -> coordinator; "train.finish" coordinator -> ranks.
# "train.drain" coordinator -> every rank after each probe step (--probe-every),
# which every rank waits for: value 1 = stop after `step` (a checkpoint is
# written there, the layout is about to change), 0 = go on.
struct TrainStep {
  step @0 :Int64;
  rank @1 :Int32;
  value @2 :Float64;
  job @3 :UInt64;
  snapshotEvery @4 :Int32;  # train.drain: the in-memory snapshot interval from the next step on (0 = unchanged)
}

# "train.snap" rank -> its buddy's "train-snap" actor after every
# --snapshot-every'th step of an elastic job (actors/train_snapshots.hpp):
# what the owner's checkpoint shard of that step would hold, kept in the
# buddy's memory so that the owner's death loses no step. Tensor i is
# names[i] ("params.block.3", "m.block.3", "v.head", ...), or a piece of it
# (offsets, totals) when the snapshot travels in `parts` messages of
# bounded size (actors/train_snapshot_wire.hpp).
struct TrainSnapshot {
  owner @0 :Int32;         # the rank whose state this is
  step @1 :Int64;          # taken after this step's update
  job @2 :UInt64;          # the run's id from the roster
  names @3 :List(Text);
  ranges @4 :List(Range);  # where each bucket's moment shard lies in the bucket
  lossScale @5 :Text;      # "scale good_steps skipped" with dynamic loss scaling, else ""
  struct Range {
    bucket @0 :Text;       # "block.3", "head"
    lo @1 :Int64;
    hi @2 :Int64;
    n @3 :Int64;
  }
  sizes @6 :List(Int64);   # in a TrainSnapshotIndex: each named tensor's values (no tensors travel);
                           # in a train.snapget: the values wanted from offsets[i] (empty: whole tensors)
  offsets @7 :List(Int64); # train.snap: where each named tensor's values start in the whole tensor;
                           # train.snapget: where the wanted values start (empty: whole tensors)
  totals @8 :List(Int64);  # train.snap: each named tensor's whole size (empty: whole tensors)
  parts @9 :Int32;         # train.snap: how many messages carry this snapshot (0: one)
}

# "train.snaps" a "train-snap" keeper -> whoever asked "train.snaps?" (a
# request whose TrainStep names the run, `job`): every snapshot it holds of
# that run, without tensors (names, sizes, ranges, loss scale). A
# "train.snapget" request (a TrainSnapshot naming the run, the owner, the
# step and the tensors wanted, none = all, with offsets and sizes when
# only ranges of them are) is answered with a "train.snap" of those
# tensors (of those ranges, with offsets and totals).
struct TrainSnapshotIndex {
  holder @0 :Int32;
  snapshots @1 :List(TrainSnapshot);
}

# "train.offer" a worker (`corolla train --join`) -> the elastic launcher's
# "train-lobby" actor: it is ready to run a rank (apps/train_lobby.hpp).
struct TrainOffer {
  name @0 :Text;           # how the launcher names it in its messages
  machine @1 :Text;        # "" or, for a --cluster job, the machine it is in the
                           # cluster file's terms (schedule::with_machine, TOML)
}

# "train.assign" launcher -> a pooled worker's "train-joiner" actor: run
# `corolla <args>` with `job` as the job file (its "--job-file" value is
# replaced by the worker's own copy). "train.release" (no body): the job is
# over, leave the pool. "train.next" launcher -> a rank process holding its
# snapshots between grids ("train-next"): run the rank `args` names
# (--rank, --coordinator) of the job `job` in this process; `run` is the
# run whose snapshots it holds (what lets the launcher in).
struct TrainAssign {
  args @0 :List(Text);
  job @1 :Text;            # the job description (apps/train_job_file.hpp), JSON
  run @2 :UInt64;          # train.next: the held run's id (0 in train.assign)
}

# "train.successor" the elastic launcher -> each local rank process's
# "train-successor" actor (apps/launcher_takeover.hpp): what a survivor
# needs to carry the job on when the launcher (the coordinator) dies. Sent
# at each grid's roster and before each step is printed; answered empty.
struct TrainTakeover {
  token @0 :Text;          # the job's takeover token (its job file's): only the launcher has it
  launcher @1 :Int32;      # the launcher's process id (this machine)
  cwd @2 :Text;            # the launcher's working directory
  args @3 :List(Text);     # the launcher's command line, without argv[0]
  job @4 :Text;            # the running grid's job description (apps/train_job_file.hpp), JSON
  run @5 :UInt64;          # the running grid's run id (0 before its roster)
  printed @6 :Int32;       # the last step printed
  processes @7 :List(TakeoverProcess);
  ledger @8 :Text;         # JSON: the re-plans so far, steps run, last loss, start time
  launcherNode @9 :Text;   # the launcher's node id: its link going down is the first sign of its death
  jobFile @10 :Text;       # the running grid's job file (private, this machine): a new launcher removes it
}

# A process of an elastic job: a rank of the running grid (rank >= 0) or a
# process holding the grid before's snapshots (rank -1).
struct TakeoverProcess {
  rank @0 :Int32;
  pid @1 :Int32;
  nodeId @2 :Text;
  endpoint @3 :Text;
  started @4 :UInt64;      # its start time (/proc, clock ticks after boot): a reused pid is not it
}

# "train.successor?" a launcher taking over -> a rank process's
# "train-successor" actor: the newest state it keeps (answered with a
# train.successor body; unknown_actor when it has none).
struct TrainTakeoverAsk {
  token @0 :Text;
}

# "train.abort" coordinator -> every rank: the job failed (a rank died);
# also a failing rank -> the coordinator, saying why, before its node stops.
struct TrainAbort {
  reason @0 :Text;
  job @1 :UInt64;          # the run's id (0 before a roster): another run's abort is ignored
}

# "train.waits?" coordinator -> a rank's "train-watch" actor, a request
# whose body is a TrainStep (the run's id and the step awaited): what is
# the rank doing? Asked when no message came for the stall threshold
# (schedule/wait_graph.hpp); answered only for the rank's own run, with
# "train.waits" and this body.
struct TrainWaits {
  rank @0 :Int32;
  computing @1 :Text;      # the compute call it is inside ("" = none)
  computingS @2 :Float64;  # for how long
  progress @3 :UInt64;     # compute calls ended + messages taken so far
  waits @4 :List(Wait);    # what its actors wait for now
  struct Wait {
    what @0 :Text;
    from @1 :Int32;        # the sender's rank, -2 the coordinator, -1 unknown
    seconds @2 :Float64;   # waited so far
  }
}

# ---- node control (actors/node_control.hpp) ------------------------------------
# "control.reshape" harness -> a node's "control" actor (published only when
# the node was given a control token): shape everything the node sends with
# `profile` from now on, "" = as each link was set up. Obeyed only when
# `token` is the node's; the answer is "control.ok" (no body) or an error.
struct ControlReshape {
  token @0 :Text;
  profile @1 :Text;
}

# control.partition: from the harness holding the node's control token.
# on: drop every message to and from every peer except the sender of this
# request (the harness keeps its control link); off: traffic flows again.
struct ControlPartition {
  token @0 :Text;
  on @1 :Bool;
}

# control.corrupt: from the harness holding the node's control token. The
# node's actor published as `actor` (e.g. "span") returns wrong outputs
# from now on (on) or correct ones again (off): a broken or malicious
# volunteer that the swarm client's spot checks must catch.
struct ControlCorrupt {
  token @0 :Text;
  actor @1 :Text;
  on @2 :Bool;
}

# control.stall: from the harness holding the node's control token. The
# work the node's actor published as `actor` watches (a training rank's
# "train-watch": its stage's compute) stops making progress while the node
# stays up (on), as a kernel that never returns, or goes on again (off).
struct ControlStall {
  token @0 :Text;
  actor @1 :Text;
  on @2 :Bool;
}

# control.lose: from the harness holding the node's control token. The
# node's training mailbox ("train") drops the next `count` messages of
# `type` (e.g. "train.act") that reach it, as if lost on the way: every
# process and link stays up while the job waits for them.
struct ControlLose {
  token @0 :Text;
  type @1 :Text;
  count @2 :UInt32;
}

# ---- reachability (actors/dialback.hpp) --------------------------------------
# Body of "reach.dialback": a node asks a relay-offering peer to dial it back
# at the endpoint it would announce. The answer ("reach.result") says
# whether that node answered the hello there.
struct DialBack {
  endpoint @0 :Text;
}

struct DialBackResult {
  reached @0 :Bool;
  reason @1 :Text;     # why not, for the log
}

# ---- fragments (net/fragment.hpp) -------------------------------------------
# A message larger than the transport's fragment size travels as fragments
# that interleave with other traffic on the connection. A fragment is one
# ZeroMQ message: frame 0 = the 8-byte marker FF FF FF FF 'f' 'r' 'a' 'g'
# (no Envelope can start so: it would announce 2^32 segments) followed by
# this struct, then one or more payload frames. The payload frames of all
# fragments of a message, in order, are the message's own frames (envelope,
# then tensors) laid end to end.
struct Fragment {
  messageId @0 :UInt64;          # per connection and direction, from 1
  position @1 :UInt64;           # byte offset of this fragment's payload in the message
  frameSizes @2 :List(UInt64);   # first fragment only (position 0): the message's frame sizes
}
