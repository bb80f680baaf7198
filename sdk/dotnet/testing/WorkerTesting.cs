// Virtufin.Worker.Testing: unit tests of a C# worker on Mono, without the
// node and without a test framework (the node has none: NuGet is not
// available). Compile it into the test program next to the worker and its
// tests (wmctl new --engine csharp writes a Makefile that does):
//
//   mcs -target:library -out:build/Virtufin.Worker.dll devkit/*.cs
//   mcs -r:build/Virtufin.Worker.dll -out:build/tests.exe Worker.cs WorkerTests.cs devkit/testing/*.cs
//   mono build/tests.exe [name-filter...]
//
// Not part of the DevKit assembly the node compiles (sdk/dotnet/src).
using System;
using System.Collections.Generic;
using System.Linq;
using System.Reflection;
using System.Security.Cryptography;
using System.Text;
using System.Threading.Tasks;
using Virtufin.Worker.Json;

namespace Virtufin.Worker.Testing
{
    /// <summary>Marks a static test method (void or Task) for <see cref="TestRunner"/>.</summary>
    [AttributeUsage(AttributeTargets.Method)]
    public sealed class TestAttribute : Attribute { }

    /// <summary>A failed assertion.</summary>
    public sealed class AssertionException : Exception
    {
        /// <summary>A failed assertion with its message.</summary>
        public AssertionException(string message) : base(message) { }
    }

    /// <summary>Assertions; each throws an <see cref="AssertionException"/> saying what differs.</summary>
    public static class Assert
    {
        /// <summary>Fails the test.</summary>
        public static void Fail(string message)
        {
            throw new AssertionException(message);
        }

        /// <summary>condition holds.</summary>
        public static void True(bool condition, string what)
        {
            if (!condition) Fail("expected true: " + what);
        }

        /// <summary>expected equals actual.</summary>
        public static void Equal<T>(T expected, T actual, string what = null)
        {
            if (!EqualityComparer<T>.Default.Equals(expected, actual))
                Fail(Prefix(what) + "expected <" + Show(expected) + "> but got <" + Show(actual) + ">");
        }

        /// <summary>actual holds the same JSON as expectedJson (JsonNode.DeepEquals).</summary>
        public static void Json(string expectedJson, JsonNode actual, string what = null)
        {
            var expected = JsonNode.Parse(expectedJson);
            if (!JsonNode.DeepEquals(expected, actual))
                Fail(Prefix(what) + "expected JSON " + Text(expected) + " but got " + Text(actual));
        }

        static string Prefix(string what)
        {
            return what == null ? "" : what + ": ";
        }

        static string Text(JsonNode node)
        {
            return node == null ? "null" : node.ToJsonString();
        }

        static string Show(object o)
        {
            return o == null ? "null" : o.ToString();
        }
    }

    /// <summary>Runs the [Test] methods of the test program.</summary>
    public static class TestRunner
    {
        /// <summary>
        /// Runs every static [Test] method of the entry assembly (those whose
        /// name contains one of args, when given) in order of class and
        /// method name, prints "PASS name" or "FAIL name: message" each and a
        /// summary, and returns the exit code: 1 when one failed or none ran.
        /// </summary>
        public static int Run(string[] args)
        {
            var assembly = Assembly.GetEntryAssembly() ?? Assembly.GetCallingAssembly();
            var tests = assembly.GetTypes()
                .SelectMany(t => t.GetMethods(BindingFlags.Public | BindingFlags.NonPublic | BindingFlags.Static))
                .Where(m => m.GetCustomAttributes(typeof(TestAttribute), false).Length > 0)
                .Select(m => new { Name = m.DeclaringType.Name + "." + m.Name, Method = m })
                .Where(t => args == null || args.Length == 0 || args.Any(a => t.Name.Contains(a)))
                .OrderBy(t => t.Name, StringComparer.Ordinal)
                .ToList();
            int failed = 0;
            foreach (var test in tests)
            {
                try
                {
                    var result = test.Method.Invoke(null, null) as Task;
                    if (result != null) result.GetAwaiter().GetResult();
                    Console.WriteLine("PASS " + test.Name);
                }
                catch (Exception e)
                {
                    while (e is TargetInvocationException && e.InnerException != null) e = e.InnerException;
                    failed++;
                    var message = e is AssertionException ? e.Message : e.GetType().Name + ": " + e.Message + "\n" + e.StackTrace;
                    Console.WriteLine("FAIL " + test.Name + ": " + message);
                }
            }
            Console.WriteLine(string.Format("{0} tests, {1} passed, {2} failed", tests.Count, tests.Count - failed, failed));
            return failed > 0 || tests.Count == 0 ? 1 : 0;
        }
    }

    /// <summary>
    /// Calls a worker the way the host does and completes its outputs the
    /// way the node does (internal/dispatch): a missing id becomes
    /// "&lt;input id&gt;/&lt;worker id&gt;/&lt;index&gt;/&lt;source tag&gt;", a missing source
    /// "workmanager/workers/&lt;worker id&gt;", and every output carries the
    /// input's correlationid (none when the input has none). For the node's
    /// output policy, limits and engine, use wmctl run.
    /// </summary>
    public static class WorkerHarness
    {
        /// <summary>An input event: JSON data, id "e-1" and source "local" unless given.</summary>
        public static CloudEvent Event(string type, JsonNode data, string id = "e-1", string source = "local", string correlationId = null)
        {
            var ev = new CloudEvent { Id = id, Source = source, Type = type, DataContentType = "application/json", Data = data };
            if (correlationId != null) ev[CloudEvent.CorrelationIdExtension] = correlationId;
            return ev;
        }

        /// <summary>
        /// Runs worker (an IWorker or IMultiOutputWorker; the latter is
        /// preferred, as by the host) on a copy of input and returns its
        /// completed outputs (empty for none).
        /// </summary>
        public static IList<CloudEvent> Run(object worker, CloudEvent input, string workerId = "local")
        {
            if (worker == null) throw new ArgumentNullException("worker");
            if (input == null) throw new ArgumentNullException("input");
            IList<CloudEvent> outputs;
            var multi = worker as IMultiOutputWorker;
            var single = worker as IWorker;
            if (multi != null)
                outputs = multi.ProcessAllAsync(input.Clone()).GetAwaiter().GetResult() ?? new List<CloudEvent>();
            else if (single != null)
            {
                var one = single.ProcessAsync(input.Clone()).GetAwaiter().GetResult();
                outputs = one == null ? new List<CloudEvent>() : new List<CloudEvent> { one };
            }
            else
                throw new ArgumentException(worker.GetType().Name + " implements neither IWorker nor IMultiOutputWorker", "worker");
            var result = new List<CloudEvent>();
            var tag = SourceTag(input.Source ?? "");
            for (int i = 0; i < outputs.Count; i++)
            {
                var o = outputs[i];
                if (o == null || string.IsNullOrEmpty(o.Type))
                    throw new AssertionException("output " + i + " has no type: the node fails the event");
                o = o.Clone();
                if (string.IsNullOrEmpty(o.Id)) o.Id = IdBase(input.Id ?? "") + "/" + workerId + "/" + i + "/" + tag;
                if (string.IsNullOrEmpty(o.Source)) o.Source = "workmanager/workers/" + workerId;
                o[CloudEvent.CorrelationIdExtension] = input[CloudEvent.CorrelationIdExtension];
                result.Add(o);
            }
            return result;
        }

        /// <summary>Run, for a worker that answers exactly one output.</summary>
        public static CloudEvent RunOne(object worker, CloudEvent input, string workerId = "local")
        {
            var outputs = Run(worker, input, workerId);
            if (outputs.Count != 1) throw new AssertionException("expected one output but got " + outputs.Count);
            return outputs[0];
        }

        static string IdBase(string id)
        {
            if (id.Length <= 64) return id;
            return "sha256:" + Hex(Sha256(id), 16);
        }

        static string SourceTag(string source)
        {
            return Hex(Sha256(source), 4);
        }

        static byte[] Sha256(string s)
        {
            using (var h = SHA256.Create()) return h.ComputeHash(Encoding.UTF8.GetBytes(s));
        }

        static string Hex(byte[] b, int n)
        {
            var sb = new StringBuilder(2 * n);
            for (int i = 0; i < n; i++) sb.Append(b[i].ToString("x2"));
            return sb.ToString();
        }
    }
}
