using System;
using System.Threading;

namespace Virtufin.Worker
{
    /// <summary>What the WorkManager host process provides to workers.</summary>
    public static class HostServices
    {
        static Func<string, string, byte[], byte[]> gateway;

        /// <summary>
        /// The gateway: <c>(service, method, request body) =&gt; response body</c>.
        /// Set by the WorkManager host at start: it answers synchronously through
        /// the node, which calls the backend by Dapr service invocation under the
        /// worker's allowed_gateway_targets. Null outside the host. Failures are
        /// thrown (as <see cref="GatewayException"/>).
        /// </summary>
        public static Func<string, string, byte[], byte[]> Gateway
        {
            get { return Volatile.Read(ref gateway); }
            set { Volatile.Write(ref gateway, value); }
        }
    }

    /// <summary>
    /// A gateway call failed: refused by the policy, unreachable, the backend
    /// answered an error, or there is no gateway; the message says which.
    /// </summary>
    public class GatewayException : Exception
    {
        /// <summary>A gateway failure without a message.</summary>
        public GatewayException() : base("gateway call failed") { }

        /// <summary>A gateway failure with a message.</summary>
        public GatewayException(string message) : base(message) { }

        /// <summary>A gateway failure with a message and a cause.</summary>
        public GatewayException(string message, Exception inner) : base(message, inner) { }
    }
}
