// A tiny test framework: static methods marked [Test] (void or Task) in this
// assembly run in order of class and method name; each prints "PASS name" or
// "FAIL name: message". The exit code is 1 when a test failed (or none ran).
// Arguments, when given, select tests whose name contains one of them.
using System;
using System.Collections.Generic;
using System.Linq;
using System.Reflection;
using System.Threading.Tasks;
using Virtufin.Worker.Json;

namespace Virtufin.Worker.Tests
{
    [AttributeUsage(AttributeTargets.Method)]
    sealed class TestAttribute : Attribute { }

    sealed class AssertionException : Exception
    {
        public AssertionException(string message) : base(message) { }
    }

    static class Assert
    {
        public static void Fail(string message)
        {
            throw new AssertionException(message);
        }

        public static void True(bool condition, string what)
        {
            if (!condition) Fail("expected true: " + what);
        }

        public static void False(bool condition, string what)
        {
            if (condition) Fail("expected false: " + what);
        }

        public static void Equal<T>(T expected, T actual, string what = null)
        {
            if (!EqualityComparer<T>.Default.Equals(expected, actual))
                Fail((what == null ? "" : what + ": ") + "expected <" + Show(expected) + "> but got <" + Show(actual) + ">");
        }

        public static void Null(object actual, string what = null)
        {
            if (actual != null) Fail((what == null ? "" : what + ": ") + "expected null but got <" + Show(actual) + ">");
        }

        public static void NotNull(object actual, string what = null)
        {
            if (actual == null) Fail((what == null ? "" : what + ": ") + "expected a value but got null");
        }

        public static void SequenceEqual<T>(IEnumerable<T> expected, IEnumerable<T> actual, string what = null)
        {
            var e = expected.ToList();
            var a = actual.ToList();
            if (!e.SequenceEqual(a))
                Fail((what == null ? "" : what + ": ") + "expected [" + string.Join(", ", e.Select(x => Show(x))) + "] but got [" + string.Join(", ", a.Select(x => Show(x))) + "]");
        }

        /// <summary>actual holds the same JSON as expectedJson (compared with JsonNode.DeepEquals).</summary>
        public static void Json(string expectedJson, JsonNode actual, string what = null)
        {
            var expected = JsonNode.Parse(expectedJson);
            if (!JsonNode.DeepEquals(expected, actual))
                Fail((what == null ? "" : what + ": ") + "expected JSON " + Text(expected) + " but got " + Text(actual));
        }

        public static string Text(JsonNode node)
        {
            return node == null ? "null" : node.ToJsonString();
        }

        public static TException Throws<TException>(Action action, string what = null) where TException : Exception
        {
            try
            {
                action();
            }
            catch (TException e)
            {
                return e;
            }
            catch (Exception e)
            {
                Fail((what == null ? "" : what + ": ") + "expected " + typeof(TException).Name + " but got " + e.GetType().Name + ": " + e.Message);
            }
            Fail((what == null ? "" : what + ": ") + "expected " + typeof(TException).Name + " but nothing was thrown");
            return null;
        }

        public static async Task<TException> ThrowsAsync<TException>(Func<Task> action, string what = null) where TException : Exception
        {
            Exception caught = null;
            try
            {
                await action();
            }
            catch (Exception e)
            {
                caught = e;
            }
            if (caught == null)
                Fail((what == null ? "" : what + ": ") + "expected " + typeof(TException).Name + " but nothing was thrown");
            var typed = caught as TException;
            if (typed == null)
                Fail((what == null ? "" : what + ": ") + "expected " + typeof(TException).Name + " but got " + caught.GetType().Name + ": " + caught.Message);
            return typed;
        }

        static string Show(object o)
        {
            if (o == null) return "null";
            var bytes = o as byte[];
            if (bytes != null) return "bytes " + BitConverter.ToString(bytes);
            return o.ToString();
        }
    }

    static class Program
    {
        static int Main(string[] args)
        {
            var tests = typeof(Program).Assembly.GetTypes()
                .SelectMany(t => t.GetMethods(BindingFlags.Public | BindingFlags.NonPublic | BindingFlags.Static))
                .Where(m => m.GetCustomAttributes(typeof(TestAttribute), false).Length > 0)
                .Select(m => new { Name = m.DeclaringType.Name + "." + m.Name, Method = m })
                .Where(t => args.Length == 0 || args.Any(a => t.Name.Contains(a)))
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
}
