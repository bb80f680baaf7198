using System;
using System.Collections.Generic;
using System.Reflection;
using System.Text;
using System.Threading.Tasks;
using Virtufin.Worker.Json;

namespace Virtufin.Worker
{
    /// <summary>
    /// A worker whose inputs are commands: data is a JSON object whose
    /// <c>command</c> field names a member of the enum T, matched
    /// case-insensitively ("START", "Start" and "start" select T.Start; numbers
    /// and undefined names do not). T must be an enum (checked by the
    /// constructor: C# 7.2 has no Enum constraint). Problems are error
    /// responses, never failures: "Failed to parse command JSON", "Missing
    /// 'command' field", "Unknown command: &lt;command&gt;", and for a handler
    /// exception "Internal error: &lt;ExceptionType&gt;: &lt;message&gt;". To fail
    /// the event instead, throw from an overridden <see cref="ProcessAsync"/>
    /// before calling the base.
    /// </summary>
    public abstract class CommandWorker<T> : WorkerBase where T : struct
    {
        const string BadJson = "Failed to parse command JSON";
        const string MissingCommand = "Missing 'command' field";
        const string UnknownCommand = "Unknown command: ";
        const string InternalError = "Internal error: ";

        static readonly Dictionary<string, T> ByName = new Dictionary<string, T>(StringComparer.OrdinalIgnoreCase);
        static readonly string TypeProblem = IndexNames();

        static string IndexNames()
        {
            var type = typeof(T);
            if (!type.IsEnum) return "CommandWorker<" + type.Name + ">: the command type must be an enum";
            foreach (var name in Enum.GetNames(type))
            {
                var value = (T)Enum.Parse(type, name);
                T existing;
                if (ByName.TryGetValue(name, out existing) && !existing.Equals(value))
                    return "enum " + type.Name + ": two members have the same wire name \"" + name.ToLowerInvariant() + "\"";
                ByName[name] = value;
            }
            return null;
        }

        /// <summary>A command worker answering with responseType (see <see cref="WorkerBase"/>);
        /// throws <see cref="ArgumentException"/> when T is not an enum.</summary>
        protected CommandWorker(string responseType, string source = null) : base(responseType, source)
        {
            if (TypeProblem != null) throw new ArgumentException(TypeProblem);
        }

        /// <summary>The name of a command on the wire: the member's name in lower case.</summary>
        public static string WireName(T command)
        {
            return command.ToString().ToLowerInvariant();
        }

        /// <summary>
        /// Parses the command and calls <see cref="HandleAsync"/>; problems and
        /// handler exceptions become error responses.
        /// </summary>
        public override async Task<CloudEvent> ProcessAsync(CloudEvent input)
        {
            if (input == null) throw new ArgumentNullException("input");
            JsonObject payload;
            T command;
            string problem = Parse(input, out command, out payload);
            if (problem == null) problem = Prepare(input, command, payload);
            if (problem != null) return Error(input, problem);
            try
            {
                var pending = HandleAsync(input, command, payload);
                return pending == null ? null : await pending.ConfigureAwait(false);
            }
            catch (Exception e)
            {
                return Error(input, InternalErrorMessage(e));
            }
        }

        /// <summary>
        /// Handles one command; payload is the input's whole data object
        /// (<c>command</c> included). Returns the output or null for none; an
        /// exception becomes an "Internal error: ..." error response.
        /// </summary>
        protected abstract Task<CloudEvent> HandleAsync(CloudEvent input, T command, JsonNode payload);

        /// <summary>Called after parsing, before the handler: an error message, or null to go on.</summary>
        internal virtual string Prepare(CloudEvent input, T command, JsonObject payload)
        {
            return null;
        }

        static string Parse(CloudEvent input, out T command, out JsonObject payload)
        {
            command = default(T);
            payload = null;
            var data = input.Data;
            string text = null;
            if (input.DataBase64 != null)
            {
                try
                {
                    text = new UTF8Encoding(false, true).GetString(input.DataBase64);
                }
                catch (ArgumentException) // DecoderFallbackException
                {
                    return BadJson;
                }
            }
            else if (data is JsonValue)
                data.AsValue().TryGetValue(out text);
            if (text != null)
            {
                try
                {
                    data = JsonNode.Parse(text);
                }
                catch (JsonException)
                {
                    return BadJson;
                }
            }
            payload = data as JsonObject;
            if (payload == null) return BadJson;
            var sent = payload["command"];
            if (sent == null) return MissingCommand;
            string name;
            if (sent is JsonValue && sent.AsValue().TryGetValue(out name))
            {
                if (ByName.TryGetValue(name, out command)) return null;
                return UnknownCommand + name;
            }
            return UnknownCommand + sent.ToJsonString();
        }

        /// <summary>"Internal error: Type: message" for e, unwrapping AggregateException
        /// and TargetInvocationException.</summary>
        internal static string InternalErrorMessage(Exception e)
        {
            while ((e is AggregateException || e is TargetInvocationException) && e.InnerException != null)
                e = e.InnerException;
            return InternalError + e.GetType().Name + ": " + e.Message;
        }
    }
}
