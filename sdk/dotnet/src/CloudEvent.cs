using System;
using System.Collections.Generic;
using System.Globalization;
using Virtufin.Worker.Json;

namespace Virtufin.Worker
{
    /// <summary>
    /// A CloudEvent (spec 1.0) as workers see and return it. Outputs need only
    /// <see cref="Type"/>: the node fills id, source and the correlation id.
    /// </summary>
    public sealed class CloudEvent
    {
        /// <summary>The extension the node copies from an input to all of its outputs.</summary>
        public const string CorrelationIdExtension = "correlationid";

        static readonly HashSet<string> Attributes = new HashSet<string>(StringComparer.Ordinal)
        {
            "specversion", "id", "source", "type", "datacontenttype", "dataschema", "subject", "time", "data", "data_base64",
        };

        JsonNode data;
        byte[] dataBase64;
        readonly Dictionary<string, object> extensions = new Dictionary<string, object>(StringComparer.Ordinal);

        /// <summary>An event with <see cref="SpecVersion"/> "1.0" and nothing else.</summary>
        public CloudEvent()
        {
            SpecVersion = "1.0";
        }

        /// <summary>The id attribute.</summary>
        public string Id { get; set; }
        /// <summary>The source attribute (a URI reference).</summary>
        public string Source { get; set; }
        /// <summary>The type attribute; for outputs, the topic they go to.</summary>
        public string Type { get; set; }
        /// <summary>The specversion attribute, "1.0" by default.</summary>
        public string SpecVersion { get; set; }
        /// <summary>The datacontenttype attribute, e.g. "application/json".</summary>
        public string DataContentType { get; set; }
        /// <summary>The dataschema attribute (a URI).</summary>
        public string DataSchema { get; set; }
        /// <summary>The subject attribute.</summary>
        public string Subject { get; set; }
        /// <summary>The time attribute as its RFC 3339 text.</summary>
        public string Time { get; set; }

        /// <summary>
        /// The data: the decoded JSON value, or a string <see cref="JsonValue"/> for
        /// text data. Setting it to non-null clears <see cref="DataBase64"/>.
        /// </summary>
        public JsonNode Data
        {
            get { return data; }
            set
            {
                data = value;
                if (value != null) dataBase64 = null;
            }
        }

        /// <summary>
        /// Binary data (data_base64 in JSON). Setting it to non-null clears <see cref="Data"/>.
        /// </summary>
        public byte[] DataBase64
        {
            get { return dataBase64; }
            set
            {
                dataBase64 = value;
                if (value != null) data = null;
            }
        }

        /// <summary>
        /// The extension attributes by name (never null). Values are string, long,
        /// int or bool; names are lower-case letters and digits (checked by
        /// <see cref="ToJson"/> and the indexer).
        /// </summary>
        public IDictionary<string, object> Extensions { get { return extensions; } }

        /// <summary>An extension's value (null when absent); setting null removes it.</summary>
        public object this[string extension]
        {
            get
            {
                object value;
                extensions.TryGetValue(extension, out value);
                return value;
            }
            set
            {
                string problem = CheckExtensionName(extension);
                if (problem != null) throw new ArgumentException(problem, "extension");
                if (value == null)
                {
                    extensions.Remove(extension);
                    return;
                }
                problem = CheckExtensionValue(extension, value);
                if (problem != null) throw new ArgumentException(problem, "value");
                extensions[extension] = value;
            }
        }

        static string CheckExtensionName(string name)
        {
            if (string.IsNullOrEmpty(name)) return "an extension name must not be empty";
            foreach (char c in name)
                if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')))
                    return "extension name \"" + name + "\": CloudEvents extension names are lower-case letters and digits";
            if (Attributes.Contains(name)) return "\"" + name + "\" is a CloudEvents attribute, not an extension";
            return null;
        }

        static string CheckExtensionValue(string name, object value)
        {
            if (value is string || value is long || value is int || value is bool) return null;
            return "extension \"" + name + "\": the value must be a string, long, int or bool, not " + value.GetType().Name;
        }

        /// <summary>
        /// Parses an event in CloudEvents JSON (structured) form, as the node sends
        /// it. Members that are no attribute are extensions: a JSON string becomes a
        /// string, an integer a long, a boolean a bool, anything else its JSON text;
        /// null members are left out; without specversion it is "1.0". Throws <see cref="FormatException"/> (with the
        /// <see cref="JsonException"/> as inner exception for invalid JSON).
        /// </summary>
        public static CloudEvent Parse(string json)
        {
            if (json == null) throw new ArgumentNullException("json");
            JsonNode node;
            try
            {
                node = JsonNode.Parse(json);
            }
            catch (JsonException e)
            {
                throw new FormatException("a CloudEvent must be JSON: " + e.Message, e);
            }
            var obj = node as JsonObject;
            if (obj == null)
                throw new FormatException("a CloudEvent in JSON must be an object, not " + Describe(node));
            var ev = new CloudEvent();
            foreach (var member in obj)
            {
                var value = member.Value;
                if (value == null) continue;
                switch (member.Key)
                {
                    case "specversion": ev.SpecVersion = Text(member.Key, value); break;
                    case "id": ev.Id = Text(member.Key, value); break;
                    case "source": ev.Source = Text(member.Key, value); break;
                    case "type": ev.Type = Text(member.Key, value); break;
                    case "datacontenttype": ev.DataContentType = Text(member.Key, value); break;
                    case "dataschema": ev.DataSchema = Text(member.Key, value); break;
                    case "subject": ev.Subject = Text(member.Key, value); break;
                    case "time": ev.Time = Text(member.Key, value); break;
                    case "data": ev.data = value; break;
                    case "data_base64":
                        string encoded = Text(member.Key, value);
                        try
                        {
                            ev.dataBase64 = Convert.FromBase64String(encoded);
                        }
                        catch (FormatException e)
                        {
                            throw new FormatException("CloudEvent attribute \"data_base64\" is not base64: " + e.Message, e);
                        }
                        break;
                    default:
                        ev.extensions[member.Key] = ExtensionValue(value);
                        break;
                }
            }
            if (ev.data != null && ev.dataBase64 != null)
                throw new FormatException("a CloudEvent must not have both \"data\" and \"data_base64\"");
            return ev;
        }

        static string Describe(JsonNode node)
        {
            if (node == null) return "null";
            if (node is JsonArray) return "an array";
            string s;
            if (node.AsValue().TryGetValue(out s)) return "a string";
            bool b;
            return node.AsValue().TryGetValue(out b) ? "a boolean" : "a number";
        }

        static string Text(string attribute, JsonNode value)
        {
            string s;
            var v = value as JsonValue;
            if (v == null || !v.TryGetValue(out s))
                throw new FormatException("CloudEvent attribute \"" + attribute + "\" must be a string, not " + Describe(value));
            return s;
        }

        static object ExtensionValue(JsonNode value)
        {
            var v = value as JsonValue;
            if (v != null)
            {
                string s;
                bool b;
                long l;
                if (v.TryGetValue(out s)) return s;
                if (v.TryGetValue(out b)) return b;
                if (v.TryGetValue(out l)) return l;
            }
            return value.ToJsonString();
        }

        /// <summary>
        /// The event in CloudEvents JSON (structured) form, compact: null
        /// attributes are left out, <see cref="DataBase64"/> is written as
        /// data_base64, extensions as top-level members. Throws
        /// <see cref="InvalidOperationException"/> for an invalid extension.
        /// </summary>
        public string ToJson()
        {
            var obj = new JsonObject();
            Put(obj, "specversion", SpecVersion);
            Put(obj, "id", Id);
            Put(obj, "source", Source);
            Put(obj, "type", Type);
            Put(obj, "datacontenttype", DataContentType);
            Put(obj, "dataschema", DataSchema);
            Put(obj, "subject", Subject);
            Put(obj, "time", Time);
            foreach (var ext in extensions)
            {
                string problem = CheckExtensionName(ext.Key);
                if (problem == null && ext.Value != null) problem = CheckExtensionValue(ext.Key, ext.Value);
                if (problem != null) throw new InvalidOperationException(problem);
                if (ext.Value is string) obj[ext.Key] = (string)ext.Value;
                else if (ext.Value is long) obj[ext.Key] = (long)ext.Value;
                else if (ext.Value is int) obj[ext.Key] = (int)ext.Value;
                else if (ext.Value is bool) obj[ext.Key] = (bool)ext.Value;
            }
            if (dataBase64 != null) obj["data_base64"] = Convert.ToBase64String(dataBase64);
            else if (data != null) obj["data"] = data;
            return obj.ToJsonString();
        }

        static void Put(JsonObject obj, string name, string value)
        {
            if (value != null) obj[name] = value;
        }

        /// <summary>A deep copy (data, binary data and extensions included).</summary>
        public CloudEvent Clone()
        {
            var copy = new CloudEvent
            {
                Id = Id,
                Source = Source,
                Type = Type,
                SpecVersion = SpecVersion,
                DataContentType = DataContentType,
                DataSchema = DataSchema,
                Subject = Subject,
                Time = Time,
            };
            copy.data = data == null ? null : data.DeepClone();
            copy.dataBase64 = dataBase64 == null ? null : (byte[])dataBase64.Clone();
            foreach (var ext in extensions) copy.extensions[ext.Key] = ext.Value;
            return copy;
        }

        /// <summary>A short description: type, id and source.</summary>
        public override string ToString()
        {
            return string.Format(CultureInfo.InvariantCulture, "CloudEvent(type={0}, id={1}, source={2})", Type, Id, Source);
        }
    }

    /// <summary>Helpers for building output events.</summary>
    public static class CloudEventExtensions
    {
        /// <summary>
        /// Copies the input's correlationid extension onto output (nothing when
        /// the input has none) and returns output. The node does the same for
        /// every output anyway; this makes it visible in worker code and tests.
        /// </summary>
        public static CloudEvent WithCorrelationId(this CloudEvent output, CloudEvent input)
        {
            if (output == null) throw new ArgumentNullException("output");
            if (input == null) throw new ArgumentNullException("input");
            var value = input[CloudEvent.CorrelationIdExtension];
            if (value != null) output.Extensions[CloudEvent.CorrelationIdExtension] = value;
            return output;
        }
    }
}
