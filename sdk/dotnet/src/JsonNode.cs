using System;
using System.Globalization;
using System.Text;

namespace Virtufin.Worker.Json
{
    /// <summary>
    /// A node of the DevKit's JSON document model: a <see cref="JsonObject"/>,
    /// a <see cref="JsonArray"/> or a <see cref="JsonValue"/>. JSON <c>null</c>
    /// is a C# <c>null</c> reference. Named like System.Text.Json.Nodes so that
    /// worker code reads the same. Nodes may be shared between containers (there
    /// is no parent); use <see cref="DeepClone"/> to copy one before changing it.
    /// </summary>
    public abstract class JsonNode
    {
        /// <summary>The maximum nesting depth of parsed and written documents.</summary>
        public const int MaxDepth = 256;

        internal JsonNode() { }

        /// <summary>
        /// Parses JSON text (one value, surrounded by optional whitespace).
        /// JSON <c>null</c> gives <c>null</c>. Throws <see cref="JsonException"/>
        /// (with the position) on invalid input.
        /// </summary>
        public static JsonNode Parse(string json)
        {
            if (json == null) throw new ArgumentNullException("json");
            return new JsonParser(json).ParseDocument();
        }

        /// <summary>The node as compact JSON text.</summary>
        public string ToJsonString()
        {
            var sb = new StringBuilder();
            WriteTo(sb, 0);
            return sb.ToString();
        }

        /// <summary>JSON text of a node that may be null (<c>null</c> for null).</summary>
        internal static string ToJsonString(JsonNode node)
        {
            return node == null ? "null" : node.ToJsonString();
        }

        internal abstract void WriteTo(StringBuilder sb, int depth);

        internal static void Write(JsonNode node, StringBuilder sb, int depth)
        {
            if (depth > MaxDepth)
                throw new JsonException("cannot write JSON: maximum depth " + MaxDepth + " exceeded (a cycle?)");
            if (node == null) sb.Append("null");
            else node.WriteTo(sb, depth);
        }

        /// <summary>The member named key of a <see cref="JsonObject"/> (null when absent);
        /// throws <see cref="InvalidOperationException"/> on other nodes.</summary>
        public virtual JsonNode this[string key]
        {
            get { throw NotA("JsonObject"); }
            set { throw NotA("JsonObject"); }
        }

        /// <summary>The element at index of a <see cref="JsonArray"/>;
        /// throws <see cref="InvalidOperationException"/> on other nodes.</summary>
        public virtual JsonNode this[int index]
        {
            get { throw NotA("JsonArray"); }
            set { throw NotA("JsonArray"); }
        }

        /// <summary>
        /// The value of a <see cref="JsonValue"/> as T (string, bool, int, long,
        /// double, decimal, their nullable forms, or object); throws
        /// <see cref="InvalidOperationException"/> when it is not one or does not fit.
        /// </summary>
        public T GetValue<T>()
        {
            var v = this as JsonValue;
            if (v == null) throw NotA("JsonValue");
            T result;
            if (!v.TryGetValue(out result))
                throw new InvalidOperationException("the JSON value " + Abbreviate(v.ToJsonString()) + " cannot be read as " + typeof(T).Name);
            return result;
        }

        /// <summary>This node as a <see cref="JsonObject"/>; throws <see cref="InvalidOperationException"/> otherwise.</summary>
        public JsonObject AsObject()
        {
            var o = this as JsonObject;
            if (o == null) throw NotA("JsonObject");
            return o;
        }

        /// <summary>This node as a <see cref="JsonArray"/>; throws <see cref="InvalidOperationException"/> otherwise.</summary>
        public JsonArray AsArray()
        {
            var a = this as JsonArray;
            if (a == null) throw NotA("JsonArray");
            return a;
        }

        /// <summary>This node as a <see cref="JsonValue"/>; throws <see cref="InvalidOperationException"/> otherwise.</summary>
        public JsonValue AsValue()
        {
            var v = this as JsonValue;
            if (v == null) throw NotA("JsonValue");
            return v;
        }

        /// <summary>A deep copy of this node.</summary>
        public JsonNode DeepClone()
        {
            return Clone(this, 0);
        }

        internal static JsonNode Clone(JsonNode node, int depth)
        {
            if (node == null) return null;
            if (depth > MaxDepth)
                throw new JsonException("cannot copy JSON: maximum depth " + MaxDepth + " exceeded (a cycle?)");
            return node.CloneAt(depth);
        }

        internal abstract JsonNode CloneAt(int depth);

        /// <summary>Whether two nodes (either may be null) hold the same JSON:
        /// objects compare members regardless of order, numbers by value.</summary>
        public static bool DeepEquals(JsonNode a, JsonNode b)
        {
            return Equal(a, b, 0);
        }

        internal static bool Equal(JsonNode a, JsonNode b, int depth)
        {
            if (ReferenceEquals(a, b)) return true;
            if (a == null || b == null) return false;
            if (depth > MaxDepth) throw new JsonException("cannot compare JSON: maximum depth " + MaxDepth + " exceeded (a cycle?)");
            return a.EqualsAt(b, depth);
        }

        internal abstract bool EqualsAt(JsonNode other, int depth);

        /// <summary>A string value's text (unquoted); otherwise <see cref="ToJsonString()"/>.</summary>
        public override string ToString()
        {
            return ToJsonString();
        }

        InvalidOperationException NotA(string kind)
        {
            return new InvalidOperationException("the JSON node is a " + GetType().Name + ", not a " + kind);
        }

        internal static string Abbreviate(string s)
        {
            return s.Length <= 64 ? s : s.Substring(0, 61) + "...";
        }

        /// <summary>A string value (null for null).</summary>
        public static implicit operator JsonNode(string value) { return JsonValue.Create(value); }
        /// <summary>A boolean value.</summary>
        public static implicit operator JsonNode(bool value) { return JsonValue.Create(value); }
        /// <summary>A number value.</summary>
        public static implicit operator JsonNode(int value) { return JsonValue.Create(value); }
        /// <summary>A number value.</summary>
        public static implicit operator JsonNode(long value) { return JsonValue.Create(value); }
        /// <summary>A number value (finite only).</summary>
        public static implicit operator JsonNode(double value) { return JsonValue.Create(value); }
        /// <summary>A number value.</summary>
        public static implicit operator JsonNode(decimal value) { return JsonValue.Create(value); }

        /// <summary>The string of a string value (null for null).</summary>
        public static explicit operator string(JsonNode node) { return node == null ? null : node.GetValue<string>(); }
        /// <summary>The value of a boolean value.</summary>
        public static explicit operator bool(JsonNode node) { return Required(node).GetValue<bool>(); }
        /// <summary>The value of a number value.</summary>
        public static explicit operator int(JsonNode node) { return Required(node).GetValue<int>(); }
        /// <summary>The value of a number value.</summary>
        public static explicit operator long(JsonNode node) { return Required(node).GetValue<long>(); }
        /// <summary>The value of a number value.</summary>
        public static explicit operator double(JsonNode node) { return Required(node).GetValue<double>(); }
        /// <summary>The value of a number value.</summary>
        public static explicit operator decimal(JsonNode node) { return Required(node).GetValue<decimal>(); }

        static JsonNode Required(JsonNode node)
        {
            if (node == null) throw new InvalidOperationException("the JSON value is null");
            return node;
        }

        /// <summary>Appends s as a JSON string literal.</summary>
        internal static void WriteString(StringBuilder sb, string s)
        {
            sb.Append('"');
            for (int i = 0; i < s.Length; i++)
            {
                char c = s[i];
                switch (c)
                {
                    case '"': sb.Append("\\\""); break;
                    case '\\': sb.Append("\\\\"); break;
                    case '\b': sb.Append("\\b"); break;
                    case '\f': sb.Append("\\f"); break;
                    case '\n': sb.Append("\\n"); break;
                    case '\r': sb.Append("\\r"); break;
                    case '\t': sb.Append("\\t"); break;
                    default:
                        if (c < 0x20 || c == '\u2028' || c == '\u2029' || IsLoneSurrogate(s, i))
                            sb.Append("\\u").Append(((int)c).ToString("x4", CultureInfo.InvariantCulture));
                        else if (char.IsHighSurrogate(c))
                        {
                            sb.Append(c).Append(s[i + 1]);
                            i++;
                        }
                        else sb.Append(c);
                        break;
                }
            }
            sb.Append('"');
        }

        static bool IsLoneSurrogate(string s, int i)
        {
            char c = s[i];
            if (char.IsHighSurrogate(c)) return i + 1 >= s.Length || !char.IsLowSurrogate(s[i + 1]);
            return char.IsLowSurrogate(c); // a low surrogate not consumed with its high one
        }
    }

    /// <summary>Invalid JSON text, or a document too deep to handle.</summary>
    public class JsonException : Exception
    {
        /// <summary>The character offset in the input where the problem was found, or -1.</summary>
        public int Position { get; private set; }

        /// <summary>A JSON error without a message.</summary>
        public JsonException() : this("invalid JSON") { }

        /// <summary>A JSON error with a message.</summary>
        public JsonException(string message) : base(message) { Position = -1; }

        /// <summary>A JSON error with a message and a cause.</summary>
        public JsonException(string message, Exception inner) : base(message, inner) { Position = -1; }

        /// <summary>A JSON error at a character offset of the input (appended to the message).</summary>
        public JsonException(string message, int position)
            : base(message + " at position " + position.ToString(CultureInfo.InvariantCulture))
        {
            Position = position;
        }
    }
}
