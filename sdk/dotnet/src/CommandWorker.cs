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
    /// and undefined names do not). T must be an enum: the original's
    /// <c>where T : struct, Enum</c>, which mcs cannot express, is checked by the
    /// constructor and by the host at load, with Roslyn's error CS0315. Problems are error
    /// responses, never failures: "Failed to parse command JSON", "Missing
    /// 'command' field", "Unknown command: &lt;command&gt;", and for a handler
    /// exception "Internal error: &lt;ExceptionType&gt;: &lt;message&gt;". To fail
    /// the event instead, throw from an overridden <see cref="ProcessAsync"/>
    /// before calling the base.
    /// </summary>
    public abstract class CommandWorker<T> : WorkerBase where T : struct
    {
        static readonly Dictionary<string, T> ByName = new Dictionary<string, T>(StringComparer.OrdinalIgnoreCase);
        static readonly string TypeProblem = IndexNames();

        static string IndexNames()
        {
            var type = typeof(T);
            if (!type.IsEnum) return HostBinding.EnumConstraintError(typeof(CommandWorker<>), type);
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
        /// throws <see cref="ArgumentException"/> (error CS0315) when T is not an enum.</summary>
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
                return Error(input, CommandParsing.InternalErrorMessage(e));
            }
            finally
            {
                Finish();
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

        /// <summary>Called when the handler is done.</summary>
        internal virtual void Finish()
        {
        }

        static string Parse(CloudEvent input, out T command, out JsonObject payload)
        {
            command = default(T);
            JsonNode sent;
            var problem = CommandParsing.Payload(input, out payload, out sent);
            if (problem != null) return problem;
            string name;
            if (sent is JsonValue && sent.AsValue().TryGetValue(out name))
            {
                if (ByName.TryGetValue(name, out command)) return null;
                return CommandParsing.UnknownCommand + name;
            }
            return CommandParsing.UnknownCommand + sent.ToJsonString();
        }
    }

    /// <summary>
    /// A worker whose inputs are commands named by strings (the original
    /// DevKit's non-generic CommandWorker): data is a JSON object whose
    /// <c>command</c> field, a string, is passed as it is to
    /// <see cref="HandleCommandAsync"/>. When <see cref="Commands"/> is not null,
    /// a command not in it (compared case-insensitively) is answered
    /// "Unknown command: &lt;command&gt;" without calling the handler; a handler
    /// can answer the same with <see cref="UnknownCommand"/>. The other
    /// problems are the error responses of <see cref="CommandWorker{T}"/>.
    /// </summary>
    public abstract class CommandWorker : WorkerBase
    {
        /// <summary>A command worker answering with responseType (see <see cref="WorkerBase"/>).</summary>
        protected CommandWorker(string responseType, string source = null) : base(responseType, source)
        {
        }

        /// <summary>The commands the worker handles, or null (the default): every string reaches the handler.</summary>
        protected virtual System.Collections.Generic.ICollection<string> Commands { get { return null; } }

        /// <summary>
        /// Parses the command and calls <see cref="HandleCommandAsync"/>; problems
        /// and handler exceptions become error responses.
        /// </summary>
        public override async Task<CloudEvent> ProcessAsync(CloudEvent input)
        {
            if (input == null) throw new ArgumentNullException("input");
            JsonObject payload;
            JsonNode sent;
            string command = null;
            var problem = CommandParsing.Payload(input, out payload, out sent);
            if (problem == null)
            {
                if (!(sent is JsonValue) || !sent.AsValue().TryGetValue(out command))
                    problem = CommandParsing.UnknownCommand + sent.ToJsonString();
                else if (!Known(command))
                    problem = CommandParsing.UnknownCommand + command;
            }
            if (problem == null) problem = Prepare(input, command, payload);
            if (problem != null) return Error(input, problem);
            try
            {
                var pending = HandleCommandAsync(input, command, payload);
                return pending == null ? null : await pending.ConfigureAwait(false);
            }
            catch (Exception e)
            {
                return Error(input, CommandParsing.InternalErrorMessage(e));
            }
            finally
            {
                Finish();
            }
        }

        bool Known(string command)
        {
            var known = Commands;
            if (known == null) return true;
            foreach (var k in known)
                if (string.Equals(k, command, StringComparison.OrdinalIgnoreCase)) return true;
            return false;
        }

        /// <summary>
        /// Handles one command (as sent); node is the input's whole data object
        /// (<c>command</c> included). Returns the output or null for none; an
        /// exception becomes an "Internal error: ..." error response.
        /// </summary>
        protected abstract Task<CloudEvent> HandleCommandAsync(CloudEvent input, string command, JsonNode node);

        /// <summary>The error response "Unknown command: &lt;command&gt;" to input.</summary>
        protected CloudEvent UnknownCommand(CloudEvent input, string command)
        {
            return Error(input, CommandParsing.UnknownCommand + command);
        }

        /// <summary>Called after parsing, before the handler: an error message, or null to go on.</summary>
        internal virtual string Prepare(CloudEvent input, string command, JsonObject payload)
        {
            return null;
        }

        /// <summary>Called when the handler is done.</summary>
        internal virtual void Finish()
        {
        }
    }

    /// <summary>The command workers' parsing and messages.</summary>
    static class CommandParsing
    {
        internal const string BadJson = "Failed to parse command JSON";
        internal const string MissingCommand = "Missing 'command' field";
        internal const string UnknownCommand = "Unknown command: ";
        const string InternalError = "Internal error: ";

        /// <summary>
        /// The input's data as a JSON object (a JSON object, JSON text in a
        /// string, or UTF-8 JSON in DataBase64) and its non-null command field;
        /// an error message, or null.
        /// </summary>
        internal static string Payload(CloudEvent input, out JsonObject payload, out JsonNode command)
        {
            payload = null;
            command = null;
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
            command = payload["command"];
            if (command == null) return MissingCommand;
            return null;
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
