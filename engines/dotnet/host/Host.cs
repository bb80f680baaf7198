// The WorkManager .NET worker host: one process runs one worker. The Go
// engine (engines/dotnet) starts it as `mono wmhost.exe` (or on `dotnet`),
// inside the node's sandbox, and speaks the framed protocol of the Python
// runner with it: requests on fd 3, replies on fd 4, stdout and stderr are
// the worker's log. Every frame is a 4-byte little-endian payload length, a
// kind byte and the payload.
//
//   host -> node  'H' hello (runtime description)
//   node -> host  'S' setup (a spare host, before 'L'): KEY=VALUE lines of its worker's VIRTUFIN_WORKER_* variables
//   node -> host  'L' load: JSON {"assemblies": [paths], "probe": [dirs], "lockdown": base64 or absent}
//   host -> node  'K' loaded, or 'X' error
//   node -> host  'E' one CloudEvent, structured JSON
//   host -> node  'R' JSON null, one event or a list, or 'X' JSON {"type","message","traceback"}
//   host -> node  'G' gateway call mid-event: JSON {"service","method"}, '\n', body
//   node -> host  'g' 0 and the response, or 1 and an error message
//
// The DevKit assembly (Virtufin.Worker) is the one the host itself is linked
// against: a worker assembly's reference to it, or to the original DevKit's
// name Virtufin.Worker.DevKit, resolves to that single copy. The assembly
// holds its types twice, in Virtufin.Worker and in Virtufin.Worker.DevKit
// (the original's namespace): a worker's IWorker is one of the two, and the
// HostBinding of that namespace runs it.
using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Reflection;
using System.Runtime.InteropServices;
using System.Text;
using System.Threading;
using System.Threading.Tasks;
using Virtufin.Worker;
using Virtufin.Worker.Json;

namespace Virtufin.WorkManager.Host
{
    // FdStream reads or writes one inherited file descriptor with the libc
    // calls, on Mono and CoreCLR alike.
    internal sealed class FdStream : Stream
    {
        [DllImport("libc.so.6", SetLastError = true)]
        static extern IntPtr read(int fd, byte[] buf, IntPtr count);

        [DllImport("libc.so.6", SetLastError = true)]
        static extern IntPtr write(int fd, byte[] buf, IntPtr count);

        const int EINTR = 4;
        readonly int fd;
        byte[] scratch = new byte[0];

        public FdStream(int fd) { this.fd = fd; }

        public override int Read(byte[] buffer, int offset, int count)
        {
            var buf = offset == 0 ? buffer : Scratch(count);
            for (;;)
            {
                var n = (long)read(fd, buf, (IntPtr)count);
                if (n >= 0)
                {
                    if (buf != buffer)
                        Buffer.BlockCopy(buf, 0, buffer, offset, (int)n);
                    return (int)n;
                }
                var errno = Marshal.GetLastWin32Error();
                if (errno != EINTR)
                    throw new IOException("read(" + fd + ") failed with errno " + errno);
            }
        }

        public override void Write(byte[] buffer, int offset, int count)
        {
            while (count > 0)
            {
                byte[] buf = buffer;
                if (offset != 0)
                {
                    buf = Scratch(count);
                    Buffer.BlockCopy(buffer, offset, buf, 0, count);
                }
                var n = (long)write(fd, buf, (IntPtr)count);
                if (n < 0)
                {
                    var errno = Marshal.GetLastWin32Error();
                    if (errno == EINTR)
                        continue;
                    throw new IOException("write(" + fd + ") failed with errno " + errno);
                }
                offset += (int)n;
                count -= (int)n;
            }
        }

        byte[] Scratch(int n)
        {
            if (scratch.Length < n)
                scratch = new byte[n];
            return scratch;
        }

        public override bool CanRead { get { return true; } }
        public override bool CanWrite { get { return true; } }
        public override bool CanSeek { get { return false; } }
        public override long Length { get { throw new NotSupportedException(); } }
        public override long Position { get { throw new NotSupportedException(); } set { throw new NotSupportedException(); } }
        public override void Flush() { }
        public override long Seek(long offset, SeekOrigin origin) { throw new NotSupportedException(); }
        public override void SetLength(long value) { throw new NotSupportedException(); }
    }

    // WarmEcho is the host's own worker for Program.Warm: not public, so
    // no scan for a worker's class could ever take it.
    internal sealed class WarmEcho : IWorker
    {
        public Task<CloudEvent> ProcessAsync(CloudEvent input)
        {
            var corr = input["correlationid"];
            var data = new JsonObject
            {
                ["id"] = input.Id,
                ["data"] = input.Data == null ? null : input.Data.DeepClone(),
                ["correlationid"] = corr == null ? null : (JsonNode)corr.ToString(),
            };
            return Task.FromResult(new CloudEvent { Type = "warm.out", DataContentType = "application/json", Data = data });
        }
    }

    // WarmBase is a worker of the DevKit's WorkerBase, which most workers
    // derive from: Warm runs its first response (a new event id, whose
    // Guid's first use seeds Mono's random number generator; the
    // correlation id copied over) and a field of the data read by name,
    // as workers read theirs, before any worker waits for them.
    internal sealed class WarmBase : WorkerBase
    {
        public WarmBase() : base("warm.out") { }

        public override Task<CloudEvent> ProcessAsync(CloudEvent input)
        {
            var data = input.Data as JsonObject;
            var n = data == null ? null : data["n"];
            return Task.FromResult(Response(input, new JsonObject { ["n"] = n == null ? null : n.DeepClone() }));
        }
    }

    // WarmRich runs, in a spare host waiting after its hello
    // (StartWarmRich), what workers commonly run beyond an echo: an async
    // method's state machine, LINQ with lambdas over the usual element
    // types, a dictionary, a StringBuilder, string formatting and
    // interpolation. Mono compiles each method (and each generic
    // instantiation over int, long, double, bool) on its first call; a
    // worker doing these waited 20–27 ms on its first event for it.
    internal sealed class WarmRich : WorkerBase
    {
        readonly Dictionary<string, int> seen = new Dictionary<string, int>();

        public WarmRich() : base("warm.out") { }

        public override async Task<CloudEvent> ProcessAsync(CloudEvent input)
        {
            var doubles = new List<double> { 1.5, 2.5, 4 };
            var ints = new List<int> { 3, 1, 2 };
            var longs = new List<long> { 3, 1 };
            var strings = new List<string> { "b", "a" };
            var total = doubles.Where(v => v > 2).Select(v => v * 2).Sum() + ints.Where(v => v > 1).Select(v => v * 2).Sum() + longs.Sum();
            var names = string.Join("+", doubles.OrderByDescending(v => v).Select(v => v.ToString("F1")))
                + string.Join(",", ints.OrderBy(v => v)) + string.Join(",", strings.OrderBy(v => v).ToArray())
                + ints.Max() + ints.Min() + doubles.Average() + ints.Count(v => v > 1) + (ints.Any(v => v > 2) && strings.All(v => v.Length > 0))
                + strings.FirstOrDefault() + ints.First() + ints.ToArray().Length + doubles.ToList().Count + strings.Distinct().Count()
                + strings.ToDictionary(v => v, v => v.Length).Count + ints.GroupBy(v => v % 2).Count() + strings.Contains("a");
            var sb = new StringBuilder();
            foreach (var v in doubles)
                sb.Append(Math.Round(v)).Append(';').Append(v).Append((int)v).Append((long)v).Append(v > 2).Append("x");
            int n;
            seen.TryGetValue(input.Id, out n);
            seen[input.Id] = n + 1;
            foreach (var kv in seen)
                sb.Append(kv.Key).Append(kv.Value);
            await Task.Delay(0);
            await Task.Yield();
            var when = DateTime.UtcNow;
            return Response(input, new JsonObject {
                ["total"] = total, ["names"] = names, ["text"] = sb.ToString(), ["count"] = n + 1, ["flag"] = n > 0, ["big"] = (long)n,
                ["summary"] = $"{input.Id}:{total:F1}:{doubles.Count}:{when:o}:{when.Ticks}" + string.Format("{0}{1}", n, total),
            });
        }
    }

    internal static class Program
    {
        const byte KindSetup = (byte)'S';
        const byte KindLoad = (byte)'L', KindEvent = (byte)'E', KindHello = (byte)'H', KindOK = (byte)'K',
            KindResult = (byte)'R', KindError = (byte)'X', KindGateway = (byte)'G', KindGatewayReply = (byte)'g';
        const int MaxFrame = 1 << 30;

        static Stream requests, replies;
        static readonly UTF8Encoding Utf8 = new UTF8Encoding(false);
        static readonly List<string> probeDirs = new List<string>();
        static bool inEvent;

        static int Main(string[] args)
        {
            // FileStream refuses inherited pipe descriptors on Mono: the
            // pipes are read and written with read(2)/write(2) directly.
            requests = new FdStream(3);
            replies = new FdStream(4);
            // The worker's references are resolved by Resolve (the DevKit,
            // the worker's own directories, probeDirs, empty until the
            // load). Subscribed before the hello: the subscription took
            // 0.3-0.4 ms of a spare host's load (the event's add and
            // Delegate.Combine compiled on their first call).
            AppDomain.CurrentDomain.AssemblyResolve += Resolve;
            var spare = args.Length > 0 && args[0] == "--warm";
            if (spare)
                Warm();
            if (args.Length > 1 && args[1].StartsWith("--lockdown=", StringComparison.Ordinal))
                LockdownEarly(args[1].Substring("--lockdown=".Length));
            // A spare runs WarmRich while it waits, after its hello: the
            // first frame waits for the rest of it.
            var rich = spare ? StartWarmRich() : null;
            WriteFrame(KindHello, Utf8.GetBytes(RuntimeDescription()));
            byte kind;
            byte[] payload;
            var read = ReadFrame(out kind, out payload);
            if (rich != null && !warmedRich)
            {
                frameCame.Set();
                rich.Join();
            }
            if (!read)
                return 0;
            if (kind == KindSetup)
            {
                // A spare host learns its worker's variables before the code.
                foreach (var line in Utf8.GetString(payload).Split('\n'))
                {
                    int eq = line.IndexOf('=');
                    if (eq > 0 && line.StartsWith("VIRTUFIN_WORKER_", StringComparison.Ordinal))
                        Environment.SetEnvironmentVariable(line.Substring(0, eq), line.Substring(eq + 1));
                }
                if (!ReadFrame(out kind, out payload))
                    return 0;
            }
            if (kind != KindLoad)
            {
                Console.Error.WriteLine("wmhost: protocol error: expected a load frame, got " + (char)kind);
                return 2;
            }
            Bound worker;
            try
            {
                worker = Load(Utf8.GetString(payload));
            }
            catch (LoadException e)
            {
                WriteError(e.TypeName, e.Message, e.Detail);
                return 0; // the node kills or retires the process
            }
            HostBinding.SetGateway(CallGateway);
            Virtufin.Worker.DevKit.HostBinding.SetGateway(CallGateway);
            WriteFrame(KindOK, new byte[0]);
            while (ReadFrame(out kind, out payload))
            {
                if (kind != KindEvent)
                {
                    Console.Error.WriteLine("wmhost: protocol error: unexpected frame " + (char)kind);
                    return 2;
                }
                Serve(worker, payload);
            }
            return 0;
        }

        static string RuntimeDescription()
        {
            var mono = Type.GetType("Mono.Runtime");
            if (mono != null)
            {
                var display = mono.GetMethod("GetDisplayName", BindingFlags.NonPublic | BindingFlags.Static);
                if (display != null)
                    return "Mono " + display.Invoke(null, null);
            }
            return RuntimeInformation.FrameworkDescription;
        }

        sealed class LoadException : Exception
        {
            public readonly string TypeName, Detail;
            public LoadException(string type, string message, string detail = "") : base(message)
            {
                TypeName = type;
                Detail = detail;
            }
        }

        // Bound is a worker and the HostBinding functions of its namespace.
        sealed class Bound
        {
            public object Worker;
            public Func<string, object> Parse;
            public Func<object, object, string> Process;
        }

        // Warm runs, in a spare host before it says hello, the host's and
        // the DevKit's code that a worker's load and first call run — the
        // load request's JSON, the scan for a worker class, the checks on
        // it, its construction, an event parsed, processed and its output
        // written as JSON — on the host's own WarmEcho, so that Mono has
        // compiled it (what mono --aot did not: System.Core's LINQ, the
        // generic instantiations) before a worker waits for it. Nothing of
        // a worker is involved; a failure here changes nothing but speed.
        static void Warm()
        {
            try
            {
                var req = JsonNode.Parse("{\"assemblies\":[],\"probe\":[\"/warm\"]}").AsObject();
                foreach (var d in (JsonArray)req["probe"])
                    d.GetValue<string>();
                var types = new List<Type>(typeof(WarmEcho).Assembly.GetTypes());
                var found = types.Where(t => t.IsClass && !t.IsAbstract && !t.ContainsGenericParameters && IsWorker(t)).ToList();
                string.Join(", ", found.Select(t => t.FullName));
                HostBinding.ConstraintError(typeof(WarmEcho));
                Virtufin.Worker.DevKit.HostBinding.IsWorker(typeof(WarmEcho));
                if (typeof(WarmEcho).GetConstructor(Type.EmptyTypes) == null)
                    return;
                var worker = Activator.CreateInstance(typeof(WarmEcho));
                var input = HostBinding.ParseEvent("{\"specversion\":\"1.0\",\"id\":\"warm\",\"source\":\"wmhost\",\"type\":\"warm\"," +
                    "\"datacontenttype\":\"application/json\",\"correlationid\":\"warm\",\"data\":{\"n\":1,\"s\":\"x\",\"a\":[true,null,1.5]}}");
                Utf8.GetBytes(HostBinding.Process(worker, input));
                Utf8.GetBytes(HostBinding.Process(new WarmBase(), input));
                WarmSetup();
                WarmLockdown();
            }
            catch (Exception)
            {
            }
        }

        // StartWarmRich runs a WarmRich response on a thread of its own
        // (the lockdown, when installed, applies to every thread) once the
        // spare has waited WarmRichAfterMs after its hello: about 45 ms of
        // compiling, which a spare taken sooner (calls back to back, its
        // replacement just started) does without rather than have it beside
        // those calls; a load that comes while it runs waits for the rest.
        // A failure changes nothing but speed.
        const int WarmRichAfterMs = 250;
        static readonly ManualResetEvent frameCame = new ManualResetEvent(false);
        // warmedRich is set when the WarmRich response has run to its end:
        // the first frame then has no thread to stop (a stop and a join
        // cost half a millisecond of a load's two).
        static volatile bool warmedRich;

        static Thread StartWarmRich()
        {
            var t = new Thread(() =>
            {
                if (frameCame.WaitOne(WarmRichAfterMs))
                    return;
                try
                {
                    var input = HostBinding.ParseEvent("{\"specversion\":\"1.0\",\"id\":\"warm\",\"source\":\"wmhost\",\"type\":\"warm\"," +
                        "\"datacontenttype\":\"application/json\",\"data\":{\"n\":1}}");
                    Utf8.GetBytes(HostBinding.Process(new WarmRich(), input));
                }
                catch (Exception)
                {
                }
                warmedRich = true;
            }) { IsBackground = true, Name = "wmhost warm" };
            t.Start();
            return t;
        }

        // WarmSetup runs what Main runs on a setup frame, on a variable of
        // the host's own, set and removed again: Mono's first
        // SetEnvironmentVariable took 1.3-3 ms of a spare host's load.
        static void WarmSetup()
        {
            foreach (var line in "WMHOST_WARM=1".Split('\n'))
            {
                int eq = line.IndexOf('=');
                if (eq > 0 && line.StartsWith("WMHOST_", StringComparison.Ordinal))
                    Environment.SetEnvironmentVariable(line.Substring(0, eq), line.Substring(eq + 1));
            }
            Environment.SetEnvironmentVariable("WMHOST_WARM", null);
        }

        // WarmLockdown runs what Load's Lockdown runs before its filter is
        // installed: RuntimeInformation (an assembly of its own in Mono),
        // the base64 decode, Lockdown's own compile and the binding of its
        // native calls to libc (through a prctl that only reads): about
        // 0.3 ms of a load.
        static void WarmLockdown()
        {
            var arch = RuntimeInformation.ProcessArchitecture;
            Convert.FromBase64String("AAAAAAAAAAA=");
            System.Runtime.CompilerServices.RuntimeHelpers.PrepareMethod(
                typeof(Program).GetMethod("Lockdown", BindingFlags.NonPublic | BindingFlags.Static).MethodHandle);
            const int PR_GET_NO_NEW_PRIVS = 39;
            prctl(PR_GET_NO_NEW_PRIVS, IntPtr.Zero, IntPtr.Zero, IntPtr.Zero, IntPtr.Zero);
        }

        // IsWorker: whether t implements IWorker or IMultiOutputWorker of
        // either namespace.
        static bool IsWorker(Type t)
        {
            return HostBinding.IsWorker(t) || Virtufin.Worker.DevKit.HostBinding.IsWorker(t);
        }

        // Load resolves the worker type in the assembly and constructs it.
        static Bound Load(string spec)
        {
            JsonObject req;
            try
            {
                req = JsonNode.Parse(spec).AsObject();
            }
            catch (Exception e)
            {
                throw new LoadException("", "malformed load request: " + e.Message);
            }
            var probe = req["probe"] as JsonArray;
            if (probe != null)
                foreach (var d in probe)
                    probeDirs.Add(d.GetValue<string>());
            var lockdown = req["lockdown"];
            if (lockdown != null && lockdown.GetValue<string>() != lockedDown)
                Lockdown(Convert.FromBase64String(lockdown.GetValue<string>()));

            var types = new List<Type>();
            foreach (var a in req["assemblies"].AsArray())
            {
                var path = a.GetValue<string>();
                Assembly asm;
                try
                {
                    asm = Assembly.LoadFrom(path);
                }
                catch (BadImageFormatException e)
                {
                    throw new LoadException("BadImageFormatException", Path.GetFileName(path) + " is not a .NET assembly this runtime can load: " + e.Message);
                }
                catch (Exception e)
                {
                    throw new LoadException(e.GetType().Name, "loading " + Path.GetFileName(path) + ": " + e.Message);
                }
                try
                {
                    types.AddRange(asm.GetTypes());
                }
                catch (ReflectionTypeLoadException e)
                {
                    var first = e.LoaderExceptions.FirstOrDefault(x => x != null);
                    throw new LoadException("TypeLoadException", "loading the types of " + asm.GetName().Name + ": " +
                        (first != null ? first.Message : e.Message));
                }
            }
            var candidates = types.Where(t => t.IsClass && !t.IsAbstract && t.IsPublic && !t.ContainsGenericParameters &&
                IsWorker(t)).ToList();
            if (candidates.Count == 0)
                throw new LoadException("", "the code defines no public, non-abstract class" +
                    " implementing Virtufin.Worker.IWorker or IMultiOutputWorker (or Virtufin.Worker.DevKit's)");
            if (candidates.Count > 1)
                throw new LoadException("", "the code defines several worker classes (" +
                    string.Join(", ", candidates.Select(t => t.FullName)) + "); keep one");
            var type = candidates[0];
            var seed = Virtufin.Worker.DevKit.HostBinding.IsWorker(type);
            // What the original's `where T : struct, Enum` would have refused
            // at compile time (mcs cannot express it).
            var constraint = seed ? Virtufin.Worker.DevKit.HostBinding.ConstraintError(type) : HostBinding.ConstraintError(type);
            if (constraint != null)
                throw new LoadException("", type.FullName + ": " + constraint);
            if (type.GetConstructor(Type.EmptyTypes) == null)
                throw new LoadException("", type.FullName + " has no public parameterless constructor");
            try
            {
                var bound = new Bound { Worker = Activator.CreateInstance(type) };
                if (seed)
                {
                    bound.Parse = Virtufin.Worker.DevKit.HostBinding.ParseEvent;
                    bound.Process = Virtufin.Worker.DevKit.HostBinding.Process;
                }
                else
                {
                    bound.Parse = HostBinding.ParseEvent;
                    bound.Process = HostBinding.Process;
                }
                return bound;
            }
            catch (TargetInvocationException e)
            {
                var inner = e.InnerException ?? e;
                throw new LoadException(inner.GetType().Name, "constructing " + type.FullName + ": " + inner.Message, Detail(inner));
            }
        }

        [DllImport("libc.so.6", SetLastError = true)]
        static extern int prctl(int option, IntPtr arg2, IntPtr arg3, IntPtr arg4, IntPtr arg5);

        [DllImport("libc.so.6", SetLastError = true)]
        static extern IntPtr syscall(IntPtr number, IntPtr arg1, IntPtr arg2, IntPtr arg3);

        // Lockdown installs the node's second seccomp filter (struct
        // sock_filter[]) on every thread of the process (TSYNC), before any
        // worker code runs: no new programs, no IP sockets.
        static void Lockdown(byte[] program)
        {
            long nr;
            switch (RuntimeInformation.ProcessArchitecture)
            {
                case Architecture.X64: nr = 317; break;
                case Architecture.Arm64: nr = 277; break;
                default:
                    throw new LoadException("", "the lockdown filter is not supported on " + RuntimeInformation.ProcessArchitecture);
            }
            if (program.Length == 0 || program.Length % 8 != 0)
                throw new LoadException("", "malformed lockdown filter");
            const int PR_SET_NO_NEW_PRIVS = 38;
            if (prctl(PR_SET_NO_NEW_PRIVS, (IntPtr)1, IntPtr.Zero, IntPtr.Zero, IntPtr.Zero) != 0)
                throw new LoadException("", "the lockdown filter could not be installed: prctl(PR_SET_NO_NEW_PRIVS) failed with errno " + Marshal.GetLastWin32Error());
            var filter = Marshal.AllocHGlobal(program.Length);
            var fprog = Marshal.AllocHGlobal(16);
            Marshal.Copy(program, 0, filter, program.Length);
            Marshal.WriteInt64(fprog, 0, program.Length / 8); // unsigned short len, padding
            Marshal.WriteIntPtr(fprog, 8, filter);
            const int SECCOMP_SET_MODE_FILTER = 1, SECCOMP_FILTER_FLAG_TSYNC = 1;
            var r = syscall((IntPtr)nr, (IntPtr)SECCOMP_SET_MODE_FILTER, (IntPtr)SECCOMP_FILTER_FLAG_TSYNC, fprog);
            if (r != IntPtr.Zero)
                throw new LoadException("", "the lockdown filter could not be installed: seccomp failed (" + r + ", errno " + Marshal.GetLastWin32Error() + ")");
            // The kernel copied the program; the memory stays allocated (a few hundred bytes, once).
        }

        // lockedDown is the lockdown filter (base64) a spare host installed
        // before its hello (LockdownEarly), null when none was: a load
        // request naming the same filter does not install it twice.
        static string lockedDown;

        // LockdownEarly installs, in a spare host after its warm-up and
        // before its hello, the lockdown filter its load request will name
        // (the node's, the same for every worker): the spare waits confined,
        // and a worker's load does not spend the filter's installation (0.3-0.4
        // ms). If it cannot be installed here, Load installs it as it would
        // have (and refuses the worker if it cannot either).
        static void LockdownEarly(string program)
        {
            try
            {
                Lockdown(Convert.FromBase64String(program));
                lockedDown = program;
            }
            catch (Exception)
            {
            }
        }

        // DevKitNames are the names a worker's reference to the DevKit has:
        // this DevKit's and the original's.
        static readonly string[] DevKitNames = { typeof(IWorker).Assembly.GetName().Name, "Virtufin.Worker.DevKit" };

        // Resolve maps a worker's references: the DevKit (either name) to the
        // host's own copy, other assemblies to the worker's own directories.
        static Assembly Resolve(object sender, ResolveEventArgs args)
        {
            var name = new AssemblyName(args.Name);
            if (DevKitNames.Contains(name.Name, StringComparer.OrdinalIgnoreCase))
                return typeof(IWorker).Assembly;
            foreach (var dir in probeDirs)
            {
                var candidate = Path.Combine(dir, name.Name + ".dll");
                if (File.Exists(candidate))
                    return Assembly.LoadFrom(candidate);
            }
            return null;
        }

        static void Serve(Bound worker, byte[] payload)
        {
            object input;
            try
            {
                input = worker.Parse(Utf8.GetString(payload));
            }
            catch (Exception e)
            {
                WriteError("", "undecodable input event: " + e.Message, "");
                return;
            }
            inEvent = true;
            try
            {
                var result = worker.Process(worker.Worker, input);
                inEvent = false;
                WriteFrame(KindResult, Utf8.GetBytes(result));
            }
            catch (Exception e)
            {
                inEvent = false;
                while ((e is AggregateException || e is TargetInvocationException) && e.InnerException != null)
                    e = e.InnerException;
                WriteError(e.GetType().Name, e.Message, Detail(e));
            }
        }

        // Detail is e with its stack, without the host's own frames and
        // HostBinding's (the worker's are what its author can act on).
        static string Detail(Exception e)
        {
            var lines = e.ToString().Split('\n');
            var b = new StringBuilder();
            foreach (var line in lines)
            {
                var at = line.TrimStart();
                if (at.StartsWith("at Virtufin.WorkManager.Host.", StringComparison.Ordinal) ||
                    at.StartsWith("at Virtufin.Worker.HostBinding.", StringComparison.Ordinal) ||
                    at.StartsWith("at Virtufin.Worker.DevKit.HostBinding.", StringComparison.Ordinal))
                    continue;
                if (b.Length > 0)
                    b.Append('\n');
                b.Append(line.TrimEnd('\r', ' '));
            }
            return b.ToString();
        }

        // CallGateway sends a 'G' frame mid-event and waits for the node's answer.
        static byte[] CallGateway(string service, string method, byte[] body)
        {
            if (!inEvent)
                throw new GatewayException("gateway calls are only possible while an event is processed");
            var head = new JsonObject { ["service"] = service, ["method"] = method }.ToJsonString();
            var h = Utf8.GetBytes(head);
            body = body ?? new byte[0];
            var frame = new byte[h.Length + 1 + body.Length];
            Buffer.BlockCopy(h, 0, frame, 0, h.Length);
            frame[h.Length] = (byte)'\n';
            Buffer.BlockCopy(body, 0, frame, h.Length + 1, body.Length);
            lock (requests)
            {
                WriteFrame(KindGateway, frame);
                byte kind;
                byte[] reply;
                if (!ReadFrame(out kind, out reply))
                {
                    Environment.Exit(0); // the node is gone
                }
                if (kind != KindGatewayReply || reply.Length == 0)
                    throw new GatewayException("protocol error: unexpected reply to a gateway call");
                var rest = new byte[reply.Length - 1];
                Buffer.BlockCopy(reply, 1, rest, 0, rest.Length);
                if (reply[0] != 0)
                    throw new GatewayException(Utf8.GetString(rest));
                return rest;
            }
        }

        static void WriteError(string type, string message, string detail)
        {
            var o = new JsonObject { ["type"] = type, ["message"] = message, ["traceback"] = detail ?? "" };
            WriteFrame(KindError, Utf8.GetBytes(o.ToJsonString()));
        }

        static readonly byte[] header = new byte[5];

        static void WriteFrame(byte kind, byte[] payload)
        {
            var frame = new byte[5 + payload.Length];
            var n = payload.Length;
            frame[0] = (byte)n;
            frame[1] = (byte)(n >> 8);
            frame[2] = (byte)(n >> 16);
            frame[3] = (byte)(n >> 24);
            frame[4] = kind;
            Buffer.BlockCopy(payload, 0, frame, 5, n);
            replies.Write(frame, 0, frame.Length);
            replies.Flush();
        }

        // ReadFrame reads one frame; false at EOF (the node closed the pipe).
        static bool ReadFrame(out byte kind, out byte[] payload)
        {
            kind = 0;
            payload = null;
            if (!ReadFull(header, 5))
                return false;
            var n = header[0] | header[1] << 8 | header[2] << 16 | header[3] << 24;
            if (n < 0 || n > MaxFrame)
                throw new InvalidDataException("protocol error: frame of " + n + " bytes");
            kind = header[4];
            payload = new byte[n];
            if (!ReadFull(payload, n))
                return false;
            return true;
        }

        static bool ReadFull(byte[] buf, int n)
        {
            var off = 0;
            while (off < n)
            {
                var m = requests.Read(buf, off, n - off);
                if (m <= 0)
                    return false;
                off += m;
            }
            return true;
        }
    }
}
