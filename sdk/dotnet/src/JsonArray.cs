using System;
using System.Collections;
using System.Collections.Generic;
using System.Text;

namespace Virtufin.Worker.Json
{
    /// <summary>A JSON array; elements may be null (JSON null).</summary>
    public sealed class JsonArray : JsonNode, IList<JsonNode>
    {
        readonly List<JsonNode> items;

        /// <summary>An array of the given elements (<c>new JsonArray(1, "a", null)</c>).</summary>
        public JsonArray(params JsonNode[] items)
        {
            this.items = items == null ? new List<JsonNode>() : new List<JsonNode>(items);
        }

        /// <summary>The element at index.</summary>
        public override JsonNode this[int index]
        {
            get { return items[index]; }
            set { items[index] = value; }
        }

        /// <summary>The number of elements.</summary>
        public int Count { get { return items.Count; } }

        bool ICollection<JsonNode>.IsReadOnly { get { return false; } }

        /// <summary>Appends an element.</summary>
        public void Add(JsonNode item) { items.Add(item); }

        /// <summary>Removes all elements.</summary>
        public void Clear() { items.Clear(); }

        /// <summary>Whether the array holds this very node.</summary>
        public bool Contains(JsonNode item) { return items.Contains(item); }

        /// <summary>Copies the elements to array, starting at arrayIndex.</summary>
        public void CopyTo(JsonNode[] array, int arrayIndex) { items.CopyTo(array, arrayIndex); }

        /// <summary>The index of this very node, or -1.</summary>
        public int IndexOf(JsonNode item) { return items.IndexOf(item); }

        /// <summary>Inserts an element at index.</summary>
        public void Insert(int index, JsonNode item) { items.Insert(index, item); }

        /// <summary>Removes this very node; false when it is not an element.</summary>
        public bool Remove(JsonNode item) { return items.Remove(item); }

        /// <summary>Removes the element at index.</summary>
        public void RemoveAt(int index) { items.RemoveAt(index); }

        /// <summary>The elements in order.</summary>
        public IEnumerator<JsonNode> GetEnumerator() { return items.GetEnumerator(); }

        IEnumerator IEnumerable.GetEnumerator() { return GetEnumerator(); }

        internal override void WriteTo(StringBuilder sb, int depth)
        {
            sb.Append('[');
            for (int i = 0; i < items.Count; i++)
            {
                if (i > 0) sb.Append(',');
                Write(items[i], sb, depth + 1);
            }
            sb.Append(']');
        }

        internal override JsonNode CloneAt(int depth)
        {
            var copy = new JsonArray();
            foreach (var item in items) copy.Add(Clone(item, depth + 1));
            return copy;
        }

        internal override bool EqualsAt(JsonNode other, int depth)
        {
            var a = other as JsonArray;
            if (a == null || a.Count != Count) return false;
            for (int i = 0; i < items.Count; i++)
                if (!Equal(items[i], a.items[i], depth + 1)) return false;
            return true;
        }
    }
}
